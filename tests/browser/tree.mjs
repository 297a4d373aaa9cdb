// A run's page in headless Chromium shows the runs below it and cancels the
// whole tree. Called by tests/tests/e2e/children.rs with the server's base
// URL; the server holds a run "p" waiting for two children that sleep. Exits
// non-zero, naming the step, on the first failure.
import { drive } from "./harness.mjs";

const base = process.argv[2];

await drive(async (page, step) => {
  step("the run's page lists the runs below it, each waiting");
  await page.goto(base + "/#/run/p");
  const below = page.getByRole("list", { name: "Runs below" });
  await below.getByRole("link", { name: /^c-/ }).first().waitFor();
  if (await below.getByRole("link", { name: /^c-/ }).count() !== 2) throw new Error("not two children");
  await below.getByText("waiting", { exact: true }).first().waitFor();
  await below.getByText(/set squares/).first().waitFor();

  step("a child's page names the call that started it");
  await below.getByRole("link", { name: /^c-/ }).first().click();
  await page.getByText("Started by", { exact: true }).waitFor();
  await page.getByRole("link", { name: "p", exact: true }).click();
  // The child's page has a cancel form too: fill in p's, once p's page is
  // drawn (the list of runs below is p's alone).
  await page.getByRole("list", { name: "Runs below" }).waitFor();

  step("cancelling the run cancels its tree");
  const form = page.getByRole("form", { name: "Cancel this run" });
  await form.getByLabel("Your name").fill("browser-ana");
  await form.getByLabel("Reason").fill("wrong customer");
  await form.getByRole("button", { name: "Cancel run and its tree" }).click();
  await page.getByText(/Cancelled 3 run\(s\)/).waitFor();
  await page.getByText("by browser-ana", { exact: false }).first().waitFor();
  for (let i = 0; i < 100; i++) {
    await page.goto(base + "/#/run/p");
    await page.reload();
    const done = await page.getByRole("list", { name: "Runs below" }).getByText("cancelled", { exact: true }).count();
    if (done === 2) break;
    if (i === 99) throw new Error("the children were not shown cancelled");
    await page.waitForTimeout(200);
  }
});
