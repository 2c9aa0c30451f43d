"""200 concurrent gRPC clients (ithaca_client: status, list, watch) against ithacad while it trains:
no errors, every watcher sees every step; prints how much the step time changes.

The daemon and its worker run on one core and the clients on the other, as they would on
different machines, so the step time measures what serving the clients costs the daemon's node,
not the Python clients' own CPU time. Pollers ask once a second each, as a dashboard or an
`ithaca status` loop would (at 10 per second each the step time doubles on this 2-core
machine: the daemon's handlers then compete with the worker for its one core)."""
import os
import statistics
import threading
import time
import unittest

from harness import TMP, Daemon, job_pb2, spec_toml
from ithaca_client import Step

CLIENTS = 200
WATCHERS = 50  # of the clients; the rest poll GetJob / ListJobs


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

        threads = [threading.Thread(target=watcher if i < WATCHERS else poller, args=(i,))
                   for i in range(CLIENTS)]
        for t in threads:
            t.start()
        done = d.wait(job.id, timeout=300)
        stop.set()
        for t in threads:
            t.join(timeout=60)
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
