// What the browser tests share: headless Chromium (STEPHOST_CHROMIUM or
// Debian's), one page, and a report that names the step that failed and
// what the page showed then.
import { chromium } from "playwright-core";

/// Runs `steps(page, step)`, where `step(name)` names what follows; exits
/// non-zero, naming the step, on the first failure (or a script error in
/// the page).
export async function drive(steps) {
  const executablePath = process.env.STEPHOST_CHROMIUM || "/usr/bin/chromium";
  const browser = await chromium.launch({
    executablePath,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--no-first-run"],
  });
  let at = "start";
  const failures = [];
  let page;
  try {
    page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
    page.on("pageerror", e => failures.push(`script error: ${e.message}`));
    // Generous: the suite runs many servers at once on a small machine.
    page.setDefaultTimeout(90_000);
    await steps(page, name => { at = name; });
  } catch (e) {
    failures.push(`${at}: ${e.message}`);
    // What the page showed then, for whoever reads the failure.
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
}
