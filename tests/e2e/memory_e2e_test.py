"""ithacad's memory under plans and clients comes back (issue 53 R6): one tiny-model plan at
2^27 tokens took the daemon to 574 MB, concurrent long plans to 1.6 GB, 449 MB stayed after,
and 200 clients for 60 s took it from 22 to 138 MB, where it stayed.

A real ithacad: its resident memory (/proc/PID/status VmRSS) is read before, during and after
(1) long plans at once, in every admission slot, and (2) 200 clients, each with its own
connection, calling list, status, node and small plans for a while, twice. During the long
plans it stays within a bound that does not grow with their length; after each load it comes
back near where it started, and the second round of clients leaves no more than the first."""
import os
import threading
import time
import unittest

import grpc

from harness import TMP, Daemon, spec_toml
from ithaca_client import Client

LONG_PLANS = 3  # the admission slots less the one kept for small requests (server/jobs.h)
LONG_TOKENS = 2**25  # 384 MiB of per-token host arrays per plan before the fix
CLIENTS = 200
CLIENT_SECONDS = 15
MiB = 1 << 20


def resident(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def settled(pid, seconds=3.0):
    """VmRSS once the daemon is idle again (its planning threads and handlers done)."""
    time.sleep(seconds)
    return resident(pid)


class MemoryE2E(unittest.TestCase):
    def test_memory_comes_back_after_long_plans_and_many_clients(self):
        d = Daemon(os.path.join(TMP, "state"))
        try:
            spec = spec_toml(os.path.join(TMP, "run"))
            # The first calls set up what gRPC and SQLite keep for good.
            for _ in range(3):
                d.client.plan(toml=spec)
                d.client.list(limit=10)
            start = settled(d.pid)
            print(f"ithacad at start: {start / MiB:.1f} MiB")

            # (1) Long plans at once, every heavy slot taken; RSS sampled throughout.
            peak, stop = [start], threading.Event()

            def sample():
                while not stop.is_set():
                    peak.append(resident(d.pid))
                    time.sleep(0.02)

            outcomes = []

            def long_plan():
                try:
                    with Client(d.address, timeout=120) as c:
                        r = c.plan(toml=spec, overrides={"data.seq_len": LONG_TOKENS,
                                                         "memory.tile_tokens": 2**20})
                    outcomes.append("fits" if r.plan.fits else "does not fit")
                except grpc.RpcError as e:
                    outcomes.append(e.code().name)

            sampler = threading.Thread(target=sample)
            sampler.start()
            plans = [threading.Thread(target=long_plan) for _ in range(LONG_PLANS)]
            for t in plans:
                t.start()
            for t in plans:
                t.join()
            stop.set()
            sampler.join()
            after_plans = settled(d.pid)
            print(f"{LONG_PLANS} plans at {LONG_TOKENS} tokens ({outcomes}): peak "
                  f"{max(peak) / MiB:.1f} MiB, after {after_plans / MiB:.1f} MiB")
            self.assertEqual(len(outcomes), LONG_PLANS)
            for o in outcomes:
                self.assertIn(o, {"fits", "does not fit"})
            # Before: 12 bytes a token per plan, 1.1 GiB over the three.
            self.assertLess(max(peak) - start, 100 * MiB)
            self.assertLess(after_plans - start, 16 * MiB)

            # (2) Many clients, each its own connection, twice.
            def clients_round():
                stop_calls, errors, calls = threading.Event(), [], [0]

                def client(i):
                    try:
                        with Client(d.address, timeout=60) as c:
                            while not stop_calls.is_set():
                                k = calls[0] % 4
                                if k == 0:
                                    c.list(limit=10)
                                elif k == 1:
                                    c.node()
                                elif k == 2:
                                    try:
                                        c.status("no-such-job")
                                    except grpc.RpcError as e:
                                        if e.code() != grpc.StatusCode.NOT_FOUND:
                                            raise
                                else:
                                    try:
                                        c.plan(toml=spec)
                                    except grpc.RpcError as e:  # every slot taken: fine
                                        if (e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or
                                                "at most 4 submissions at once"
                                                not in e.details()):
                                            raise
                                calls[0] += 1
                                time.sleep(0.2)
                    except Exception as e:  # noqa: BLE001 - every error counts
                        errors.append(repr(e))

                threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
                for t in threads:
                    t.start()
                time.sleep(CLIENT_SECONDS)
                during = resident(d.pid)
                stop_calls.set()
                for t in threads:
                    t.join()
                self.assertEqual(errors, [])
                return calls[0], during, settled(d.pid)

            first_calls, first_during, first = clients_round()
            second_calls, second_during, second = clients_round()
            print(f"{CLIENTS} clients, {first_calls} calls: {first_during / MiB:.1f} MiB during, "
                  f"{first / MiB:.1f} MiB after; again, {second_calls} calls: "
                  f"{second_during / MiB:.1f} MiB during, {second / MiB:.1f} MiB after")
            self.assertLess(first - start, 24 * MiB)
            self.assertLess(second - start, 24 * MiB)
            self.assertLess(second - first, 8 * MiB)  # nothing accumulates from round to round
        finally:
            d.stop()


if __name__ == "__main__":
    unittest.main()
