// The console in headless Chromium, as a person uses it: find a run, open its
// timeline, approve a waiting approval and see the run complete, resolve an
// unknown call and see its run continue. Called by
// tests/tests/e2e/server.rs with the server's base URL; the server holds a run
// "approval-run" waiting for an approval, a run "parked-run" parked at call #3
// and a run "diverged-run" that diverged at call #1; its second argument is
// the digest of a stored chat step, whose model (`support`) streams the
// answer STREAMED over several seconds. Exits non-zero, naming the step, on
// the first failure.
import { chromium } from "playwright-core";

const base = process.argv[2];
const chatDigest = process.argv[3];
const STREAMED = "The parcel left the depot this morning, passed the sorting centre at noon and is on the van now; it will reach you before six this evening.";
const executablePath = process.env.STEPHOST_CHROMIUM || "/usr/bin/chromium";
const browser = await chromium.launch({
  executablePath,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"],
});
let step = "start";
const failures = [];
try {
  // A laptop's width.
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on("pageerror", e => failures.push(`script error: ${e.message}`));
  page.setDefaultTimeout(30_000);

  step = "the runs list shows both runs and the status counts";
  await page.goto(base + "/");
  await page.getByRole("link", { name: "approval-run" }).waitFor();
  await page.getByRole("link", { name: "parked-run" }).waitFor();
  await page.getByLabel("Runs by status").getByText("waiting", { exact: true }).waitFor();
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth > window.innerWidth);
  if (overflow) throw new Error("the runs list is wider than a laptop's window");

  step = "filtering by status finds the waiting run only";
  await page.getByRole("combobox", { name: "Status" }).selectOption("waiting");
  await page.getByRole("button", { name: "Filter" }).click();
  await page.waitForURL(/status=waiting/);
  await page.getByRole("link", { name: "parked-run" }).waitFor({ state: "detached" });
  await page.getByRole("link", { name: "approval-run" }).waitFor();

  step = "a run's timeline shows its calls with operation ids and attempts";
  await page.getByRole("link", { name: "approval-run" }).click();
  const timeline = page.getByRole("table");
  await timeline.getByText("inventory.read").waitFor();
  await timeline.getByText("approvals.request").waitFor();
  await timeline.getByText(/^op [0-9a-f]{16}$/).first().waitFor();
  await timeline.getByText("send: ok").waitFor();
  await page.getByText("Fence", { exact: true }).first().waitFor();
  // approval-run's calls so far were performed live by its one execution.
  const firstRow = timeline.locator("tbody tr").first();
  await firstRow.getByText("live", { exact: true }).waitFor();

  step = "a diverged run's timeline marks the call where it diverged";
  await page.goto(base + "/#/run/diverged-run");
  const divergedRow = page.locator("tr.diverged");
  await divergedRow.getByText("diverged here").waitFor();
  if (await divergedRow.locator("td").first().innerText() !== "1")
    throw new Error("the divergence is marked at another call than #1");
  if (await page.locator("tr.diverged").count() !== 1)
    throw new Error("more than one call is marked as the divergence");

  step = "the approvals inbox shows the details and approving sends the order";
  await page.getByRole("link", { name: /^Approvals/ }).click();
  const card = page.getByRole("region", { name: "Approval for run approval-run" });
  await card.getByText('"quantity": 10').waitFor();
  // Keyboard: type the name, then Tab to Approve and press Enter.
  await card.getByLabel("Your name").fill("browser-ana");
  await card.getByLabel("Note").fill("checked the stock");
  await card.getByLabel("Note").press("Tab");
  await page.keyboard.press("Enter");
  await page.getByText(/Call #\d+: approved — a worker continues the run/).waitFor();

  step = "the run completes on screen without a reload";
  await page.getByRole("link", { name: "Open run approval-run" }).click();
  await page.locator("dd .status.s-completed").waitFor();

  step = "after the approval, the calls before it were replayed, the rest performed live";
  const rows = page.getByRole("table").locator("tbody tr");
  await rows.first().getByText("replayed since").waitFor();
  const last = rows.last();
  await last.getByText("supplier.order").waitFor();
  await last.getByText("live", { exact: true }).waitFor();

  step = "the unknown-calls queue shows what was sent and its operation id";
  await page.getByRole("link", { name: /^Unknown calls/ }).click();
  const unknown = page.getByRole("region", { name: "Unknown call 3 of run parked-run" });
  const [queued] = await (await fetch(base + "/api/unknown")).json();
  await unknown.getByText("Operation id", { exact: true }).waitFor();
  await unknown.getByText(queued.operation_id, { exact: true }).waitFor();
  await unknown.getByLabel("Request sent").waitFor();

  step = "a receipt that is not JSON is refused in the form";
  await unknown.getByLabel(/It happened/).check();
  await unknown.getByLabel("Receipt JSON or reason").fill("{not json");
  await unknown.getByLabel("Your name").fill("browser-ana");
  await unknown.getByRole("button", { name: "Resolve" }).click();
  await unknown.getByText(/not JSON/).waitFor();

  step = "resolving with the receipt lets the run continue";
  await unknown.getByLabel("Receipt JSON or reason").fill('{"receipt": "R-77"}');
  await unknown.getByRole("button", { name: "Resolve" }).click();
  await page.getByText(/Call #3: resolved as succeeded/).waitFor();
  await page.getByRole("link", { name: "Open run parked-run" }).click();
  await page.locator("dd .status.s-completed").waitFor();

  step = "a model's answer shows on its run's page while it streams in";
  await page.evaluate(async digest => {
    const r = await fetch("/api/runs", {method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({module_digest: digest, run_id: "stream-run",
        input: {model: "support", message: "Where is my parcel?"}})});
    if (!r.ok) throw new Error(`submitting stream-run: HTTP ${r.status}`);
  }, chatDigest);
  await page.goto(base + "/#/run/stream-run");
  const streamingBox = page.getByRole("region", { name: "Model call in progress" });
  // Each event brings a word or so: seven words shown from the start are
  // pieces the console put together.
  await streamingBox.getByText(/^The parcel left the depot this morning/).waitFor();
  const partial = await streamingBox.locator("pre").innerText();
  if (!STREAMED.startsWith(partial) || partial.length >= STREAMED.length)
    throw new Error(`the answer so far is not a part of it: ${JSON.stringify(partial)}`);

  step = "the recorded answer replaces the streaming one when the run ends";
  await page.locator("dd .status.s-completed").waitFor({ timeout: 60_000 });
  await streamingBox.waitFor({ state: "detached" });
  await page.locator("dd pre").getByText("reach you before six this evening").waitFor();
  step = "the run's page shows the model call's tokens and the run's";
  await page.getByText("Model tokens", { exact: true }).waitFor();
  await page.getByRole("table").getByText(/^\d+ tokens/).waitFor();

  step = "a model call reads as its conversation: the question and the answer";
  const row = page.getByRole("table").locator("tbody tr").filter({ hasText: "models.chat" }).first();
  await row.getByText("conversation", { exact: true }).click();
  const talk = page.getByRole("region", { name: /^Conversation of call #\d+$/ });
  await talk.getByText("Where is my parcel?").waitFor();
  await talk.getByText("reach you before six this evening").waitFor();
  await talk.getByText(/stop: stop; \d+ tokens/).waitFor();

  step = "the queues are empty and say so";
  await page.getByRole("link", { name: /^Unknown calls/ }).click();
  await page.getByText("No call's outcome is in doubt.").waitFor();
  await page.getByRole("link", { name: /^Approvals/ }).click();
  await page.getByText("Nothing waits for an approval.").waitFor();
  if (failures.length) throw new Error(failures.join("; "));
  console.log("console: ok");
} catch (e) {
  console.error(`console test failed at: ${step}\n${e.stack || e}`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
