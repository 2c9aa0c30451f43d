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

    def test_overrides_are_sent_for_the_daemon_to_apply(self):
        # A dict's values as TOML text; a list as the CLI's --set strings, unchanged. Nothing is
        # applied here: ithacad applies them (engine/spec/overrides.h), for both clients.
        _, _, _, sets = ic.Client._spec_request(
            None, "name = 'x'", {"training.steps": 5, "training.lr": 1e-3, "memory.offload": True,
                                 "name": "plain words", "eval.paths": ["a.tok", "b.tok"]},
            None, None)
        self.assertEqual(sets, ["training.steps=5", "training.lr=0.001", "memory.offload=true",
                                'name="plain words"', 'eval.paths=["a.tok", "b.tok"]'])
        _, _, _, sets = ic.Client._spec_request(None, "name = 'x'",
                                                ["training.steps=5", "data.path=shards/*.tok"],
                                                None, None)
        self.assertEqual(sets, ["training.steps=5", "data.path=shards/*.tok"])
        with self.assertRaisesRegex(TypeError, "training.lr"):
            ic.Client._spec_request(None, "name = 'x'", {"training.lr": None}, None, None)
        with self.assertRaises(TypeError):
            ic.Client._spec_request(None, "name = 'x'", "training.steps=5", None, None)
        # The daemon names them in errors as this client does ("overrides", not the CLI's --set).
        from ithaca_client.client import _OVERRIDES_FLAG
        self.assertEqual(_OVERRIDES_FLAG, "overrides")

    def test_spec_requests(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "job.toml")
            with open(path, "w") as f:
                f.write('name = "j"  # a comment\n[training]\nsteps = 60\n')
            text, source, base, sets = ic.Client._spec_request(path, None, None, None, None)
            self.assertEqual((source, base, sets), (path, d, []))
            self.assertIn("# a comment", text)  # sent as written
            text, _, _, sets = ic.Client._spec_request(path, None, {"training.steps": 2}, None,
                                                       None)
            self.assertIn("# a comment", text)  # still as written: the daemon applies the set
            self.assertEqual(sets, ["training.steps=2"])
            spec = {"name": "j", "training": {"steps": 60}}
            text, source, base, _ = ic.Client._spec_request(spec, None, None, None, None)
            self.assertEqual(tomllib.loads(text), spec)
            self.assertEqual((source, base), ("spec", os.getcwd()))
            _, source, base, _ = ic.Client._spec_request(None, "name = 'x'", None, None, "/data")
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

    def test_a_job_has_one_state_type_with_names(self):
        # Submit, status, list, cancel, delete and a watch's Snapshot all give a Job whose state
        # is a JobState, as StateChange's are (issue 54 F7: submit/list gave an int).
        from ithaca_client.client import _event
        message = pb.Job(id="job-3", state=pb.JOB_STATE_RUNNING, name="sweep")
        job = ic.Job(message)
        self.assertIsInstance(job.state, ic.JobState)
        self.assertEqual(job.state.name, "RUNNING")
        self.assertEqual(job.state, pb.JOB_STATE_RUNNING)  # still the protobuf's number
        self.assertEqual((job.id, job.name), ("job-3", "sweep"))
        self.assertFalse(job.HasField("created_at"))
        self.assertIs(job.pb, message)
        self.assertEqual(job, ic.Job(pb.Job(id="job-3", state=pb.JOB_STATE_RUNNING, name="sweep")))
        self.assertEqual(repr(job), "Job(id='job-3', state=RUNNING)")
        with self.assertRaises(AttributeError):
            job.name = "other"
        snapshot = _event(pb.JobEvent(seq=0, job=message))
        self.assertIsInstance(snapshot.job, ic.Job)
        self.assertIsInstance(snapshot.job.state, ic.JobState)

    def test_job_states(self):
        self.assertEqual(ic.JobState.parse("running"), pb.JOB_STATE_RUNNING)
        self.assertEqual(ic.JobState.parse("JOB_STATE_FAILED"), ic.JobState.FAILED)
        self.assertTrue(ic.JobState.CANCELLED.terminal)
        self.assertFalse(ic.JobState.CANCELLING.terminal)
        with self.assertRaisesRegex(ValueError, "unknown job state 'done'"):
            ic.JobState.parse("done")


if __name__ == "__main__":
    unittest.main(verbosity=2)
