// The console lists a run waiting for a promise beside the approvals,
// without its token. Called by tests/tests/e2e/promises.rs with the
// server's base URL; the server holds a run "a" waiting for its promise
// "payment" (call #3). Exits non-zero, naming the step, on the first
// failure.
import { chromium } from "playwright-core";

const base = process.argv[2];
const executablePath = process.env.STEPHOST_CHROMIUM || "/usr/bin/chromium";
const browser = await chromium.launch({
  executablePath,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"],
});
let step = "start";
const failures = [];
let page;
try {
  page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on("pageerror", e => failures.push(`script error: ${e.message}`));
  // Generous: the suite runs many servers at once on a small machine.
  page.setDefaultTimeout(90_000);
  // The server has tokens: sign in with the read token the test made.
  await page.goto(base + "/");
  step = "the approvals page lists the waiting promise";
  await page.evaluate(() => sessionStorage.setItem("stephost-token", "viewer-token-0123456789"));
  await page.goto(base + "/#/approvals");
  await page.reload();
  const card = page.getByRole("region", { name: "Promise payment of run a" });
  await card.waitFor();
  await card.getByText("call #3").waitFor();
  await card.getByText("Expires").waitFor();
  step = "the run's page links from it";
  await card.getByRole("link", { name: "a", exact: true }).click();
  await page.getByText("promises.wait").first().waitFor();
} catch (e) {
  failures.push(`${step}: ${e.message}`);
  const shown = page ? await page.locator("body").innerText().catch(() => "") : "";
  failures.push(`the page showed:\n${shown}`);
} finally {
  await browser.close();
}
if (failures.length) {
  console.error(failures.join("\n"));
  process.exit(1);
}
console.log("ok");
