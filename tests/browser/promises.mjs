// The console lists a run waiting for a promise beside the approvals,
// without its token. Called by tests/tests/e2e/promises.rs with the
// server's base URL; the server holds a run "a" waiting for its promise
// "payment" (call #3). Exits non-zero, naming the step, on the first
// failure.
import { drive } from "./harness.mjs";

const base = process.argv[2];

await drive(async (page, step) => {
  // The server has tokens: sign in with the read token the test made.
  await page.goto(base + "/");
  step("the approvals page lists the waiting promise");
  await page.evaluate(() => sessionStorage.setItem("stephost-token", "viewer-token-0123456789"));
  await page.goto(base + "/#/approvals");
  await page.reload();
  const card = page.getByRole("region", { name: "Promise payment of run a" });
  await card.waitFor();
  await card.getByText("call #3").waitFor();
  await card.getByText("Expires").waitFor();
  step("the run's page links from it");
  await card.getByRole("link", { name: "a", exact: true }).click();
  await page.getByText("promises.wait").first().waitFor();
});
