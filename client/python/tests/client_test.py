"""ithaca_client without a daemon: specs written as TOML (read back by tomllib), overrides, where
the client finds ithacad, and the typed events made of the API's JobEvents. The client against a
real ithacad (watch resuming through a dropped connection included) is tests/e2e."""
import math
import os
import tempfile
import tomllib
import unittest
from unittest import mock

import ithaca_client as ic
from ithaca_client import pb
from ithaca_client import toml as ictoml


class SpecToml(unittest.TestCase):
    def test_round_trip(self):
        spec = {
            "name": "sweep \"lr\" 3\\4\n\tx\x01",
            "backend": "cpu",
            "odd key.with dot": 1,
            "model": {"preset": "tiny", "dtype": "auto"},
            "data": {"path": "shards/train-*.tok", "seq_len": 1 << 27, "shuffle": True},
            "training": {"steps": 60, "lr": 3e-3, "min_lr": 0.1 + 0.2, "weight_decay": 0.0,
                         "warmup_steps": -1, "big": 1e300},
            "memory": {"head_chunk": "auto", "offload": False},
            "eval": {"paths": ["a.tok", "b.tok"], "nested": [[1, 2], ["x"]],
                     "tables": [{"a": 1}, {"b": {"c": "d"}}]},
            "a": {"b": {"c": {"d": 1}}},
            "empty": {},
            "unicode": "été ☃",
        }
        text = ic.spec_toml(spec)
        self.assertEqual(tomllib.loads(text), spec, text)
        self.assertIn("[training]\n", text)
        self.assertIn("[a.b.c]\nd = 1\n", text)
        self.assertNotIn("[a]\n", text)  # a table of only tables needs no header of its own
        self.assertTrue(text.startswith('name = "'), text)  # top-level keys before any table

    def test_special_floats(self):
        back = tomllib.loads(ic.spec_toml({"x": math.inf, "y": -math.inf, "z": math.nan}))
        self.assertEqual(back["x"], math.inf)
        self.assertEqual(back["y"], -math.inf)
        self.assertTrue(math.isnan(back["z"]))

    def test_what_toml_cannot_hold_is_an_error_naming_the_key(self):
        with self.assertRaisesRegex(TypeError, "training.lr"):
            ic.spec_toml({"training": {"lr": None}})
        with self.assertRaisesRegex(TypeError, "data.path"):
            ic.spec_toml({"data": {"path": object()}})
        with self.assertRaises(TypeError):
            ic.spec_toml(["not", "a", "dict"])

    def test_overrides(self):
        spec = {"training": {"steps": 60}}
        ictoml.set_key(spec, "training.steps", ictoml.parse_value("5"))
        ictoml.set_key(spec, "training.lr", ictoml.parse_value("1e-3"))
        ictoml.set_key(spec, "memory.offload", ictoml.parse_value("true"))
        ictoml.set_key(spec, "name", ictoml.parse_value("plain words"))
        ictoml.set_key(spec, "data.path", ictoml.parse_value('"quoted.tok"'))
        self.assertEqual(spec, {"training": {"steps": 5, "lr": 1e-3}, "memory": {"offload": True},
                                "name": "plain words", "data": {"path": "quoted.tok"}})
        with self.assertRaisesRegex(ValueError, "training.steps is not a table"):
            ictoml.set_key(spec, "training.steps.x", 1)
        with self.assertRaisesRegex(ValueError, "empty key"):
            ictoml.set_key(spec, "training..x", 1)

    def test_spec_requests(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "job.toml")
            with open(path, "w") as f:
                f.write('name = "j"  # a comment\n[training]\nsteps = 60\n')
            text, source, base = ic.Client._spec_request(path, None, None, None, None)
            self.assertEqual((source, base), (path, d))
            self.assertIn("# a comment", text)  # sent as written
            text, _, _ = ic.Client._spec_request(path, None, {"training.steps": 2}, None, None)
            self.assertEqual(tomllib.loads(text), {"name": "j", "training": {"steps": 2}})
            spec = {"name": "j", "training": {"steps": 60}}
            text, source, base = ic.Client._spec_request(spec, None, {"training.steps": 3},
                                                         None, None)
            self.assertEqual(tomllib.loads(text)["training"]["steps"], 3)
            self.assertEqual(spec["training"]["steps"], 60, "the caller's dict is not changed")
            self.assertEqual((source, base), ("spec", os.getcwd()))
            _, source, base = ic.Client._spec_request(None, "name = 'x'", None, None, "/data")
            self.assertEqual((source, base), ("spec.toml", "/data"))
            with self.assertRaises(TypeError):
                ic.Client._spec_request(spec, "name = 'x'", None, None, None)


class Address(unittest.TestCase):
    def test_order_server_env_then_home_file_then_default(self):
        with tempfile.TemporaryDirectory() as home:
            with mock.patch.dict(os.environ, {"ITHACA_HOME": home}, clear=False):
                os.environ.pop("ITHACA_SERVER", None)
                self.assertEqual(ic.resolve_address(), ic.DEFAULT_ADDRESS)
                with open(os.path.join(home, "ithacad.addr"), "w") as f:
                    f.write("grpc=127.0.0.1:40123\nmetrics=127.0.0.1:9999\npid=7\n")
                self.assertEqual(ic.resolve_address(), "127.0.0.1:40123")
                os.environ["ITHACA_SERVER"] = "unix:/run/ithacad.sock"
                self.assertEqual(ic.resolve_address(), "unix:/run/ithacad.sock")
                self.assertEqual(ic.resolve_address("h:1"), "h:1")
                # A state directory named explicitly wins over the environment.
                self.assertEqual(ic.resolve_address(home=home), "127.0.0.1:40123")
                with ic.Client(home) as c:
                    self.assertEqual(c.address, "127.0.0.1:40123")

    def test_an_unreachable_daemon_is_an_error_naming_the_address(self):
        with ic.Client("127.0.0.1:1", timeout=2) as c:
            with self.assertRaises(ic.IthacaError) as e:
                c.node()
        self.assertIn("127.0.0.1:1: UNAVAILABLE (is ithacad running?)", str(e.exception))


class Events(unittest.TestCase):
    def test_every_kind_becomes_a_typed_event(self):
        from ithaca_client.client import _event
        e = pb.JobEvent(seq=0, job=pb.Job(id="job-1", state=pb.JOB_STATE_QUEUED))
        self.assertIsInstance(_event(e), ic.Snapshot)
        self.assertEqual(_event(e).job.id, "job-1")
        e = pb.JobEvent(seq=4)
        e.time.FromSeconds(1700000000)
        setattr(e.state, "from", pb.JOB_STATE_RUNNING)
        e.state.to = pb.JOB_STATE_SUCCEEDED
        ev = _event(e)
        self.assertEqual((ev.seq, ev.from_state, ev.to_state, ev.terminal),
                         (4, ic.JobState.RUNNING, ic.JobState.SUCCEEDED, True))
        self.assertEqual(ev.time.year, 2023)
        ev = _event(pb.JobEvent(seq=5, step=pb.StepReport(rank=1, step=3, total_steps=9,
                                                          loss=2.5)))
        self.assertEqual((type(ev), ev.rank, ev.step, ev.total_steps, ev.loss),
                         (ic.Step, 1, 3, 9, 2.5))
        ev = _event(pb.JobEvent(seq=6, eval=pb.EvalReport(step=3, loss=2.25, tokens=4096)))
        self.assertEqual((type(ev), ev.step, ev.loss, ev.tokens), (ic.Eval, 3, 2.25, 4096))
        ev = _event(pb.JobEvent(seq=7, log=pb.LogLine(rank=0, text="loading")))
        self.assertEqual((type(ev), ev.rank, ev.text), (ic.Log, 0, "loading"))

    def test_job_states(self):
        self.assertEqual(ic.JobState.parse("running"), pb.JOB_STATE_RUNNING)
        self.assertEqual(ic.JobState.parse("JOB_STATE_FAILED"), ic.JobState.FAILED)
        self.assertTrue(ic.JobState.CANCELLED.terminal)
        self.assertFalse(ic.JobState.CANCELLING.terminal)
        with self.assertRaisesRegex(ValueError, "unknown job state 'done'"):
            ic.JobState.parse("done")


if __name__ == "__main__":
    unittest.main(verbosity=2)
