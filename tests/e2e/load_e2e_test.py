"""200 concurrent gRPC clients (ithaca_client: status, list, watch) against ithacad while it trains:
no errors, every watcher sees every step; prints how much the step time changes.

The daemon and its worker run on one core and the clients on the other, as they would on
different machines, so the step time measures what serving the clients costs the daemon's node,
not the Python clients' own CPU time. Pollers ask once a second each, as a dashboard or an
`ithaca status` loop would (at 10 per second each the step time doubles on this 2-core
machine: the daemon's handlers then compete with the worker for its one core).

Beside them, heavy plans (Llama-3-8B at the longest data.seq_len allowed, for eight H200s) take
every admission slot but the one kept for small requests: each ends within the daemon's planning
bound, and small plans and the clients above are still served (issue 43 N3)."""
import os
import statistics
import threading
import time
import unittest

import grpc

from harness import TMP, Daemon, job_pb2, spec_toml
from ithaca_client import Client, Step

CLIENTS = 200
WATCHERS = 50  # of the clients; the rest poll GetJob / ListJobs
HEAVY_PLANS = 3  # the daemon's admission slots less the one kept for small requests
PLAN_BOUND_S = 30  # server/admission.h kMaxPlanTime


class LoadE2E(unittest.TestCase):
    def step_times(self, d, job_id):
        return [e.report.seconds for e in d.events(job_id, timeout=300) if isinstance(e, Step)]

    def test_200_clients_during_a_run(self):
        pinned = (os.cpu_count() or 1) >= 2
        if pinned:
            os.sched_setaffinity(0, {1})
        d = Daemon(os.path.join(TMP, "state"), cpus={0} if pinned else None)
        steps = 40
        base = d.submit(spec_toml(os.path.join(TMP, "base"), steps=steps, seq_len=256))
        base_times = self.step_times(d, base.id)
        self.assertEqual(d.get(base.id).state, job_pb2.JOB_STATE_SUCCEEDED)

        job = d.submit(spec_toml(os.path.join(TMP, "load"), steps=steps, seq_len=256))
        errors, calls, watched = [], [0] * CLIENTS, {}
        stop = threading.Event()

        def poller(i):
            while not stop.is_set():
                try:
                    if i % 2:
                        d.client.status(job.id)
                    else:
                        d.client.list(limit=10)
                    calls[i] += 1
                except Exception as e:  # noqa: BLE001 - every error counts
                    errors.append(repr(e))
                time.sleep(1.0)

        def watcher(i):
            try:
                got = [e.step for e in d.client.watch(job.id, timeout=300)
                       if isinstance(e, Step)]
                watched[i] = got
                calls[i] += 1
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

        heavy_spec = spec_toml(os.path.join(TMP, "heavy"))
        heavy_sets = {"backend": "cuda", "model.preset": "llama-3-8b", "data.seq_len": 2**27,
                      "parallel.world": 8, "parallel.sp": 8}
        heavy = []  # (seconds, outcome) of each heavy plan

        def heavy_planner():
            start = time.time()
            try:
                with Client(d.address, timeout=PLAN_BOUND_S + 60) as c:
                    r = c.plan(toml=heavy_spec, overrides=heavy_sets, hardware="h200x8")
                outcome = "fits" if r.plan.fits else "does not fit"
            except grpc.RpcError as e:  # IthacaError is one
                outcome = e.code().name
            heavy.append((time.time() - start, outcome))

        threads = [threading.Thread(target=watcher if i < WATCHERS else poller, args=(i,))
                   for i in range(CLIENTS)]
        threads += [threading.Thread(target=heavy_planner) for _ in range(HEAVY_PLANS)]
        for t in threads:
            t.start()
        # While the heavy plans hold their slots, a small plan still gets the kept one.
        time.sleep(2)
        small = d.client.plan(toml=spec_toml(os.path.join(TMP, "small")))
        self.assertTrue(small.plan.fits)
        done = d.wait(job.id, timeout=300)
        stop.set()
        for t in threads:
            t.join(timeout=PLAN_BOUND_S + 90)
        print(f"{HEAVY_PLANS} heavy plans: " +
              ", ".join(f"{o} after {t:.1f} s" for t, o in sorted(heavy)))
        self.assertEqual(len(heavy), HEAVY_PLANS)
        for seconds, outcome in heavy:
            # Each ends within the daemon's bound (and some slack for a loaded machine): planned,
            # stopped at the bound, or refused while the slots were full.
            self.assertLess(seconds, PLAN_BOUND_S + 30, outcome)
            self.assertIn(outcome, {"fits", "does not fit", "DEADLINE_EXCEEDED",
                                    "RESOURCE_EXHAUSTED"})
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
        self.assertEqual(errors, [])
        self.assertEqual(len(watched), WATCHERS)
        for got in watched.values():
            self.assertEqual(got, list(range(1, steps + 1)))
        load_times = self.step_times(d, job.id)
        self.assertEqual(len(load_times), steps)
        b, l = statistics.median(base_times[5:]), statistics.median(load_times[5:])
        print(f"{CLIENTS} clients ({WATCHERS} WatchJob streams, {sum(calls)} calls): "
              f"median step {b * 1e3:.1f} ms alone, {l * 1e3:.1f} ms under load "
              f"({(l / b - 1) * 100:+.0f}%)")
        # The step-time change is a figure, not an assertion (performance is shown by printed
        # figures, not timed tests): on this shared 2-core machine the step time itself jumps
        # between about 35 and 58 ms within one run, load or not, so a ratio of two windows'
        # medians ranged from -39% to +72% over runs that served the clients equally well.
        self.assertTrue(d.serving())
        d.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
