"""A finished two-rank job's history and report, through the CLI: `ithaca logs ID --steps` gives
every recorded step (rank 0's every step, rank 1's every 10th and last) as JSON lines, and
`ithaca report ID` writes a self-contained HTML page whose SVG plots have one point per recorded
step. Where Debian's chromium is installed (tools/setup.sh installs it for this test), a real
headless browser parses the page and renders it to a PNG that is checked to show the plots."""
import html.parser
import json
import math
import os
import shutil
import struct
import subprocess
import unittest
import zlib

import grpc

import harness
from harness import TMP, Daemon, job_pb2, spec_toml

STEPS = 24


class Page(html.parser.HTMLParser):
    """The page's elements: polylines by series, svgs, external references, text of #spec."""

    def __init__(self):
        super().__init__()
        self.stack, self.polylines, self.svgs, self.external, self.tags = [], {}, [], [], set()
        self.spec, self.in_spec, self.title = "", False, ""
        self.in_title = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        if tag not in ("meta", "line", "rect", "circle", "polyline", "br"):
            self.stack.append(tag)
        if tag == "svg":
            self.svgs.append(a)
        if tag == "polyline":
            pts = [tuple(float(v) for v in p.split(",")) for p in a["points"].split()]
            self.polylines[a["data-series"]] = pts
        for k in ("src", "href"):
            if k in a:
                self.external.append(a[k])
        if tag in ("script", "link", "img", "iframe"):
            self.external.append(tag)
        self.in_spec = self.in_spec or a.get("id") == "spec"
        self.in_title = tag == "title"

    def handle_endtag(self, tag):
        if tag in ("line", "rect", "circle", "polyline"):
            return
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
        self.stack.pop()
        if tag == "pre":
            self.in_spec = False
        if tag == "title":
            self.in_title = False

    def handle_data(self, data):
        if self.in_spec:
            self.spec += data
        if self.in_title:
            self.title += data


def png_pixels(path):
    """(width, height, rows of RGB(A) bytes) of an 8-bit, non-interlaced PNG (as chromium writes)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
    bpp = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        ftype, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 255
            elif ftype == 2:
                line[i] = (line[i] + b) & 255
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


class ReportE2E(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon(os.path.join(TMP, "state"), cpu_slots=2)
        run = os.path.join(TMP, "run")
        os.makedirs(run, exist_ok=True)
        job = cls.d.submit(spec_toml(run, steps=STEPS, name="report",
                                     extra="[parallel]\nworld = 2\nsp = 2\n"))
        cls.job = cls.d.wait(job.id, timeout=180)
        assert cls.job.state == job_pb2.JOB_STATE_SUCCEEDED, cls.job.reason
        cls.out = os.path.join(TMP, "report.html")
        r = cls.d.cli("report", job.id, "--out", cls.out)
        assert r.returncode == 0, r.stdout + r.stderr

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()

    def test_logs_steps_is_the_history_as_json_lines(self):
        r = self.d.cli("logs", self.job.id, "--steps")
        self.assertEqual(r.returncode, 0, r.stderr)
        events = [json.loads(l) for l in r.stdout.splitlines()]
        by_rank = {}
        for e in events:
            self.assertIn("time", e)
            s = e["step"]
            by_rank.setdefault(s["rank"], []).append(s)
        # Numbers, as in every -o json output (protobuf's JSON mapping gave "1").
        self.assertEqual([s["step"] for s in by_rank[0]], list(range(1, STEPS + 1)))
        self.assertEqual([s["step"] for s in by_rank[1]], [10, 20, STEPS])
        for s in by_rank[0]:
            self.assertTrue(0 < s["loss"] < 10, s)
            self.assertGreater(s["tokens_per_second"], 0)
            # Checkpoints every 10 steps and at the end: the save time rides on those steps.
            saved = s["step"] % 10 == 0 or s["step"] == STEPS
            self.assertEqual(s["checkpoint_seconds"] > 0, saved, s)
        self.assertLess(by_rank[0][-1]["loss"], by_rank[0][0]["loss"])
        # An unknown job is an error naming it.
        bad = self.d.cli("logs", "job-999", "--steps")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("job-999", bad.stderr)

    def test_report_is_self_contained_html_with_plots(self):
        with open(self.out) as f:
            text = f.read()
        self.assertTrue(text.startswith("<!DOCTYPE html>"))
        p = Page()
        p.feed(text)
        p.close()
        self.assertEqual(p.stack, [], "every element is closed")
        self.assertEqual(p.external, [], "nothing loaded from elsewhere")
        self.assertIn(self.job.id, p.title)
        # Loss, tok/s, step time, learning rate, and memory for each of the two ranks.
        self.assertEqual(len(p.svgs), 6)
        lr = p.polylines["learning rate"]
        self.assertEqual(len(lr), STEPS)
        # Warm-up, then the cosine decay: the highest rate (the lowest SVG y) is after step 1.
        self.assertLess(min(y for _, y in lr), lr[0][1])
        self.assertGreater(lr[-1][1], min(y for _, y in lr))
        self.assertEqual(len(p.polylines["train loss (rank 0)"]), STEPS)
        self.assertEqual(len(p.polylines["tok/s rank 0"]), STEPS)
        self.assertEqual(len(p.polylines["tok/s rank 1"]), 3)
        self.assertEqual(len(p.polylines["step time rank 0"]), STEPS)
        self.assertEqual(len(p.polylines["params"]), 3)  # the last chart is rank 1's memory
        for name, pts in p.polylines.items():
            for x, y in pts:
                self.assertTrue(0 <= x <= 640 and 0 <= y <= 320, (name, x, y))
        # x grows with the step; a falling loss has growing SVG y (y points down).
        loss = p.polylines["train loss (rank 0)"]
        self.assertEqual(sorted(loss), loss)
        self.assertGreater(loss[-1][1], loss[0][1])
        self.assertIn('name = "report"', p.spec)
        self.assertIn('id="plan"', text)
        self.assertIn("SUCCEEDED", text)

    def test_a_headless_browser_renders_it(self):
        chromium = shutil.which("chromium")
        if chromium is None:
            self.skipTest("chromium is not installed (tools/setup.sh installs it)")
        flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                 f"--user-data-dir={os.path.join(TMP, 'chromium')}"]
        url = "file://" + self.out
        dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True,
                             timeout=120)
        self.assertEqual(dom.returncode, 0, dom.stderr[-2000:])
        # The browser's DOM has the plots as SVG elements.
        self.assertEqual(dom.stdout.count("<svg"), 6, dom.stdout[:500])
        self.assertIn("<polyline", dom.stdout)
        png = os.path.join(TMP, "report.png")
        shot = subprocess.run(flags + [f"--screenshot={png}", "--window-size=1400,1600", url],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(shot.returncode, 0, shot.stderr[-2000:])
        w, h, bpp, rows = png_pixels(png)
        self.assertEqual((w, h), (1400, 1600))
        colors = {}
        for row in rows[::4]:
            for i in range(0, len(row), bpp * 4):
                px = row[i:i + 3]
                colors[px] = colors.get(px, 0) + 1
        total = sum(colors.values())
        white = colors.get(b"\xff\xff\xff", 0)
        # Mostly page background, but far from blank: text, axes and the series' colours.
        self.assertLess(white, total * 0.99, "blank page")
        blue = sum(n for c, n in colors.items() if c[2] > 150 and c[0] < 80 and c[1] < 160)
        self.assertGreater(blue, 20, "no plotted line in the first series' colour")

    def test_z_resubmitting_the_finished_run_and_continuing_it(self):
        """The finished run's spec again is refused at submit, saying so (no job is made, no
        slot spent; it used to succeed with no step); raising its steps continues it without a
        learning-rate jump, and the continuation's report covers the whole run."""
        run = os.path.join(TMP, "run")
        spec = lambda steps: spec_toml(run, steps=steps, name="report", resume=True,
                                       extra="[parallel]\nworld = 2\nsp = 2\n")
        before = len(self.d.client.list())
        with self.assertRaises(grpc.RpcError) as refused:
            self.d.submit(spec(STEPS))
        self.assertEqual(refused.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        reason = refused.exception.details()
        self.assertIn("holds a finished run", reason)
        self.assertIn(f"is at step {STEPS} of training.steps = {STEPS}", reason)
        self.assertIn("raise training.steps", reason)
        self.assertEqual(len(self.d.client.list()), before, "no job was made")
        # The CLI says the same, exit 2.
        spec_file = os.path.join(TMP, "again.toml")
        with open(spec_file, "w") as f:
            f.write(spec(STEPS))
        r = self.d.cli("submit", spec_file)
        self.assertEqual(r.returncode, 2)
        self.assertIn("holds a finished run", r.stderr)
        more = self.d.wait(self.d.submit(spec(STEPS + 6)).id, timeout=180)
        self.assertEqual(more.state, job_pb2.JOB_STATE_SUCCEEDED, more.reason)
        log = self.d.cli("logs", more.id, "--rank", "0", check=True).stdout
        self.assertIn(f"training.steps {STEPS} -> {STEPS + 6}: the cosine decay continues", log)
        steps = [json.loads(l)["step"] for l in
                 self.d.cli("logs", more.id, "--steps", check=True).stdout.splitlines()]
        lrs = [s["lr"] for s in steps if s["rank"] == 0]
        self.assertEqual(len(lrs), 6)
        first = [json.loads(l)["step"] for l in
                 self.d.cli("logs", self.job.id, "--steps", check=True).stdout.splitlines()]
        last_lr = [s["lr"] for s in first if s["rank"] == 0][-1]
        for lr in lrs:  # the cosine ended at min_lr; it stays there, no jump back up
            self.assertLessEqual(lr, last_lr * (1 + 1e-9))
        out = os.path.join(TMP, "report-more.html")
        r = self.d.cli("report", more.id, "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            text = f.read()
        p = Page()
        p.feed(text)
        self.assertEqual(len(p.polylines["train loss (rank 0)"]), STEPS + 6)
        self.assertIn(f"This job resumed a run begun by {self.job.id}", text)
        # A finished run in its checkpoint directory: the plan is the one admission made (planning
        # it again would warn that a submission is refused, "holds a finished run").
        self.assertIn('id="plan"', text)
        self.assertNotIn("No plan", text)
        self.assertEqual(len(p.polylines["learning rate"]), STEPS + 6)


if __name__ == "__main__":
    unittest.main(verbosity=2)
