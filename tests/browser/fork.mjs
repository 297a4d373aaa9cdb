// The console forks a failed run from its failing call with a fixed build.
// Called by tests/tests/e2e/forks.rs with the server's base URL and the
// fixed build's module digest; the server holds run "src", failed at call
// #3. Exits non-zero, naming the step, on the first failure.
import { drive } from "./harness.mjs";

const [base, digest] = process.argv.slice(2);

await drive(async (page, step) => {
  await page.goto(base + "/");
  await page.evaluate(() => sessionStorage.setItem("stephost-token", "ana-token-0123456789abcdef"));
  step("the run's page has a fork button on each call");
  await page.goto(base + "/#/run/src");
  await page.reload();
  await page.getByRole("button", { name: "Fork from call 3" }).click();
  const form = page.getByRole("form", { name: "Fork this run" });
  step("the fork form forks from that call with the build given");
  await form.getByLabel("Build").fill(digest);
  await form.getByRole("button", { name: "Fork" }).click();
  const note = page.getByRole("status").filter({ hasText: "Forked from call #3 as" });
  await note.waitFor();
  step("the fork's page names its source");
  await note.getByRole("link").click();
  await page.getByText("at call #3 (the calls before it are that run's)").waitFor();
});
