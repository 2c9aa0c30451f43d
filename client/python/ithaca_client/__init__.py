"""ithaca_client: the Python client of ithacad (Ithaca's training-job daemon).

    import ithaca_client as ic
    c = ic.Client()                       # $ITHACA_SERVER, $ITHACA_HOME/ithacad.addr, default
    job = c.submit({"name": "demo", "backend": "cpu", "model": {"preset": "tiny"},
                    "data": {"path": "corpus.tok", "seq_len": 256}, "training": {"steps": 60}})
    for ev in c.watch(job.id):
        if isinstance(ev, ic.Step) and ev.rank == 0:
            print(ev.step, ev.loss)
    print(c.status(job.id).state == ic.JobState.SUCCEEDED)

The API's messages are `ithaca_client.pb` (generated from proto/ithaca/v1/job.proto when the
package is built)."""
from ._generated import job_pb2 as pb
from .client import (DEFAULT_ADDRESS, Client, Eval, IthacaError, Job, JobState, Log, Snapshot,
                     StateChange, Step, ithaca_home, resolve_address)
from .toml import dumps as spec_toml

__all__ = ["Client", "IthacaError", "Job", "JobState", "Snapshot", "StateChange", "Step", "Eval", "Log",
           "pb", "spec_toml", "resolve_address", "ithaca_home", "DEFAULT_ADDRESS"]
