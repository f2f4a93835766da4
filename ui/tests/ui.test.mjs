// Browser test of Weir's web UI, in headless Debian chromium driven by
// playwright-core. Run by tests/e2e/test_ui.py against a live `weir serve`
// with a running streaming job:
//
//   node ui/tests/ui.test.mjs --base http://127.0.0.1:PORT --job JOB_ID --out DIR
//
// Steps: open the jobs list and find the job; open its page; see the graph
// with live element counts that grow; watch a stage's input watermark
// advance; filter the logs by level and text; press Drain and see DRAINED.
// Screenshots go to DIR (jobs.png, job-running.png, job-drained.png).
// Exits non-zero, naming the failed step, on any failure.
import { chromium } from "playwright-core";
import fs from "node:fs";
import path from "node:path";

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : fallback;
}

const base = arg("base");
const job = arg("job");
const out = arg("out", "ui/screenshots");
const executablePath = arg("chromium", process.env.WEIR_CHROMIUM || "/usr/bin/chromium");
if (!base || !job) {
  console.error("usage: node ui/tests/ui.test.mjs --base URL --job JOB_ID [--out DIR] [--chromium PATH]");
  process.exit(2);
}
fs.mkdirSync(out, { recursive: true });

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
  console.log(`ok: ${what}`);
}

async function poll(what, fn, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    last = await fn();
    if (last) {
      console.log(`ok: ${what}`);
      return last;
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`timed out after ${timeoutMs} ms: ${what} (last: ${JSON.stringify(last)})`);
}

const browser = await chromium.launch({
  executablePath,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
let failed = false;
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));

  // 1. The jobs list shows the job, with its state; the filters work.
  await page.goto(`${base}/`);
  const row = page.locator(`tr[data-job="${job}"]`);
  await row.waitFor({ timeout: 15000 });
  check((await row.locator(".state").textContent()) === "RUNNING", "the jobs list shows the job RUNNING");
  await page.fill("#filter-text", "no-such-job-anywhere");
  await poll("the text filter hides it", async () => (await row.count()) === 0, 5000);
  await page.fill("#filter-text", "");
  await page.selectOption("#filter-state", "active");
  await row.waitFor({ timeout: 5000 });
  check(true, "the 'active' state filter keeps it");
  await page.screenshot({ path: path.join(out, "jobs.png"), fullPage: true });

  // 2. Its page: the graph, drawn, with element counts that grow.
  await row.locator("a").click();
  await page.waitForURL(`**/jobs/${job}`);
  await page.locator("#graph g.node").first().waitFor({ timeout: 15000 });
  const nodes = await page.locator("#graph g.node").count();
  check(nodes >= 3, `the graph draws ${nodes} stages`);
  check((await page.locator("#graph path.edge").count()) >= 2, "the graph draws PCollections as edges");
  const total = async () => {
    const texts = await page.locator("#stages td.elements-in").allTextContents();
    return texts.reduce((a, t) => a + Number(t.replace(/,/g, "") || 0), 0);
  };
  const first = await poll("element counts appear", async () => (await total()) || false);
  await poll("element counts grow live (no reload)", async () => (await total()) > first || false, 20000);
  const labels = await page.locator("#graph text.edge-label").allTextContents();
  check(labels.some((t) => /\d/.test(t)), `edges carry element counts (${labels.filter((t) => t).join(", ")})`);

  // 3. A watermark advances: some stage's input watermark grows as a number.
  const marks = async () => (await page.locator("#stages td.input-watermark").evaluateAll(
    (tds) => tds.map((td) => Number(td.dataset.value)).filter((v) => Number.isFinite(v))));
  const before = await poll("a stage shows a numeric input watermark", async () => {
    const m = await marks();
    return m.length ? m : false;
  });
  await poll("an input watermark advances", async () => {
    const m = await marks();
    return m.length === before.length && m.some((v, i) => v > before[i]);
  }, 20000);
  await page.screenshot({ path: path.join(out, "job-running.png"), fullPage: true });

  // 4. Logs: level and text filters.
  await poll("the logs show entries", async () => (await page.locator("#logs .log").count()) > 0);
  await page.selectOption("#log-level", "0");
  const all = await poll("level DEBUG shows entries", async () => (await page.locator("#logs .log").count()) || false);
  await page.selectOption("#log-level", "4");
  const errorsOnly = await page.locator("#logs .log").evaluateAll((ls) => ls.map((l) => l.className));
  check(errorsOnly.every((c) => c.includes("log-ERROR")), `level ERROR shows only errors (${errorsOnly.length} of ${all})`);
  await page.selectOption("#log-level", "0");
  await page.fill("#log-text", "SDK harness");
  const filtered = await page.locator("#logs .log-text").allTextContents();
  check(filtered.length > 0 && filtered.every((t) => t.includes("SDK harness")),
    `the text filter keeps matching entries only (${filtered.length})`);
  await page.fill("#log-text", "");

  // 5. Drain: the job ends DRAINED, and the page says so without a reload.
  page.on("dialog", (d) => d.dismiss());
  await page.click("#drain");
  await poll("the job ends DRAINED", async () => (await page.locator("#job-state .state").textContent()) === "DRAINED", 60000);
  check(await page.locator("#drain").isDisabled(), "Drain is disabled once the job has ended");
  await page.waitForTimeout(1500);
  await page.screenshot({ path: path.join(out, "job-drained.png"), fullPage: true });
  check(errors.length === 0, `no script errors on the pages (${errors.join("; ")})`);
} catch (e) {
  failed = true;
  console.error(String(e && e.stack ? e.stack : e));
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
