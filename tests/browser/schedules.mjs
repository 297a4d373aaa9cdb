// The console lists the schedules and pauses and resumes one. Called by
// tests/tests/e2e/schedules.rs with the server's base URL; the server holds
// one schedule, "morning", active. Exits non-zero, naming the step, on the
// first failure.
import { drive } from "./harness.mjs";

const base = process.argv[2];

await drive(async (page, step) => {
  await page.goto(base + "/");
  await page.evaluate(() => sessionStorage.setItem("stephost-token", "ana-token-0123456789abcdef"));
  step("the schedules page lists the schedule");
  await page.goto(base + "/#/schedules");
  await page.reload();
  const card = page.getByRole("region", { name: "Schedule morning" });
  await card.waitFor();
  await card.getByText("0 7 * * * (Europe/Paris)").waitFor();
  await card.getByText("buffer-one").waitFor();
  step("pausing it shows it paused");
  await card.getByRole("button", { name: "Pause" }).click();
  await card.getByRole("button", { name: "Resume" }).waitFor();
  await card.getByText("paused", { exact: true }).waitFor();
  step("resuming it shows it active");
  await card.getByRole("button", { name: "Resume" }).click();
  await card.getByRole("button", { name: "Pause" }).waitFor();
  await card.getByText("active", { exact: true }).waitFor();
});
