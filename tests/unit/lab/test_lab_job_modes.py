"""The lab's Job controller (lab/jobs.py) in its two modes, on the shipped examples: in index
mode (in-process restart) a drained rank's pod is replaced alone, by a pod of the same
completion index, and the other rank's pod is never deleted; a hang stops the whole gang;
in gang mode any failure stops every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuvigil.core import exit_codes
from gpuvigil.lab.jobs import INDEX_ANNOTATION, GangJob, load_example
from gpuvigil.lab.parts import EXAMPLES, store_argv
from gpuvigil.lab.result import job_record

REPO = Path(__file__).resolve().parents[3]
EXAMPLE_DIR = REPO / "deploy/kubernetes/examples"


class Api:
    """The two pod calls the lab's Job controller makes, kept as a cluster would keep them."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []

    def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        assert name not in self.pods, f"{name} created twice"
        self.pods[name] = {**body, "metadata": {**body["metadata"], "uid": f"uid-{name}"},
                           "status": {"phase": "Pending"}}  # fmt: skip

    def delete_namespaced_pod(self, name: str, namespace: str) -> None:
        self.deleted.append(name)
        self.pods.pop(name, None)

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **_: Any) -> None:
        self.pods[name]["metadata"]["finalizers"] = body["metadata"]["finalizers"]

    def bind(self, name: str, node: str) -> None:
        self.pods[name]["spec"]["nodeName"] = node

    def end(self, name: str, code: int) -> None:
        self.pods[name]["status"] = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": code}}}],
        }


def job(mode: str) -> GangJob:
    example = load_example(EXAMPLE_DIR / EXAMPLES["in-process" if mode == "index" else "gang"])
    return GangJob(name="j", namespace="default", example=example, ranks=2,
                   args=["-m", "gpuvigil.lab.workload"], env={"WORLD_SIZE": "2"},
                   port_for=lambda: 29500, mode=mode)  # fmt: skip


def sync(j: GangJob, api: Api) -> list[tuple[str, str]]:
    return j.sync(api, list(api.pods.values()))


def started(mode: str) -> tuple[GangJob, Api]:
    j, api = job(mode), Api()
    j.start_attempt(api)
    api.bind("j-a1-r0", "n1")
    api.bind("j-a1-r1", "n2")
    sync(j, api)
    return j, api


def test_index_mode_replaces_only_the_drained_rank_and_keeps_the_survivor() -> None:
    j, api = started("index")
    survivor = api.pods["j-a1-r0"]
    # the pod is the rank itself, RANK its completion index (no torchrun)
    trainer = survivor["spec"]["containers"][0]
    assert trainer["command"] == ["python"] and trainer["args"] == ["-m", "gpuvigil.lab.workload"]
    assert survivor["metadata"]["annotations"][INDEX_ANNOTATION] == "0"
    rank_env = next(e for e in trainer["env"] if e["name"] == "RANK")
    assert INDEX_ANNOTATION in rank_env["valueFrom"]["fieldRef"]["fieldPath"]
    api.end("j-a1-r1", exit_codes.DRAINED)
    said = dict(sync(j, api))
    assert "job.pod_replaced" in said and "job.gang_stopped" not in said, said
    assert api.deleted == ["j-a1-r1"]  # only the drained pod, once its status was read
    new = api.pods["j-a2-r1"]
    assert new["metadata"]["annotations"][INDEX_ANNOTATION] == "1"
    # kept off the survivor's node by anti-affinity on every pod of the job
    terms = new["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms[0]["labelSelector"]["matchLabels"] == {"gpuvigil.io/lab-job": "j"}
    api.bind("j-a2-r1", "n3")
    sync(j, api)
    api.end("j-a1-r0", 0)
    api.end("j-a2-r1", 0)
    said = dict(sync(j, api))
    assert j.state == "Succeeded" and "job.succeeded" in said
    assert j.counted == 0  # a drain is not charged to backoffLimit
    ranks = j.ranks_record()
    assert ranks[0]["kept"] and ranks[0]["pods"][0]["uid"] == "uid-j-a1-r0"
    assert not ranks[1]["kept"] and ranks[1]["nodes"] == ["n2", "n3"]
    j.on_spare.add("j-a2-r1")  # the lab saw n3 a hot spare when the pod was bound there
    rec = job_record(j, [0])
    assert (rec["survivors"], rec["restarted"], rec["lost_steps"]) == ([0], [1], 0)
    assert rec["moved"] == [{"rank": 1, "from": "n2", "to": "n3", "to_spare": True,
                             "pod": "j-a2-r1"}]  # fmt: skip


@pytest.mark.parametrize("code", [exit_codes.HANG, exit_codes.RANK_NOT_REPLACED])
def test_index_mode_restarts_the_whole_gang_when_one_pod_cannot_cure_it(code: int) -> None:
    j, api = started("index")
    api.end("j-a1-r0", code)
    said = dict(sync(j, api))
    assert "job.gang_stopped" in said and "job.pod_replaced" not in said, said
    assert sorted(api.deleted) == ["j-a1-r0", "j-a1-r1"]
    said = dict(sync(j, api))  # every pod gone: the next attempt, every rank
    assert "job.attempt" in said and {"j-a2-r0", "j-a2-r1"} <= set(api.pods)
    assert not j.ranks_record()[0]["kept"]


def test_gang_mode_stops_every_rank_on_a_drain() -> None:
    j, api = started("gang")
    assert api.pods["j-a1-r0"]["spec"]["containers"][0]["args"][0] == "--nnodes=2"  # torchrun's
    api.end("j-a1-r1", exit_codes.DRAINED)
    said = dict(sync(j, api))
    assert "job.gang_stopped" in said and sorted(api.deleted) == ["j-a1-r0", "j-a1-r1"]
    assert "job.attempt" in dict(sync(j, api)) and j.counted == 0
    api.bind("j-a2-r0", "n1")  # the same node again: restarted, not moved
    api.bind("j-a2-r1", "n3")
    sync(j, api)
    rec = job_record(j, [1])
    assert (rec["survivors"], rec["restarted"]) == ([], [0, 1])
    assert [(m["rank"], m["from"], m["to"]) for m in rec["moved"]] == [(1, "n2", "n3")]


def test_a_failjob_code_ends_the_job_in_either_mode() -> None:
    for mode in ("index", "gang"):
        j, api = started(mode)
        api.end("j-a1-r1", exit_codes.NO_VERIFIED_CHECKPOINT)
        assert "job.failed" in dict(sync(j, api)) and j.state == "Failed"


def test_the_in_process_example_holds_the_same_policy_and_runs_its_store() -> None:
    """One exit-code table for both examples; the lab runs the store Deployment's own
    command, on loopback."""
    policy = exit_codes.pod_failure_policy(container="trainer")
    for name in EXAMPLES.values():
        assert load_example(EXAMPLE_DIR / name)["spec"]["podFailurePolicy"] == policy
    inproc = load_example(EXAMPLE_DIR / EXAMPLES["in-process"])
    assert inproc["spec"]["completionMode"] == "Indexed"
    env = {
        e["name"]: e.get("value")
        for e in inproc["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["GPUVIGIL__TRAINING__RESTART__IN_PROCESS"] == "true"
    assert env["GPUVIGIL__TRAINING__MEMTIER__ENABLED"] == "true"
    argv = store_argv(EXAMPLE_DIR / EXAMPLES["in-process"], port=4242)
    assert argv[1:] == ["-m", "gpuvigil.training.inprocess", "serve", "--host=127.0.0.1",
                        "--port=4242"]  # fmt: skip


def test_a_spare_lifted_after_the_pod_was_created_still_counts_as_its_spare() -> None:
    """The controller lifts a used spare's taint once the replacement is bound there; a lab
    pass may read the node after that and the binding only then: the node was a spare."""
    import time

    from gpuvigil.core import wire
    from gpuvigil.lab.follow import Follower

    def node(spare: bool) -> dict[str, Any]:
        taints = [{"key": wire.SPARE_TAINT, "effect": "NoSchedule"}] if spare else []
        return {"metadata": {"name": "n3"}, "spec": {"taints": taints}, "status": {}}

    f = Follower(Path("/nonexistent"))
    f.read_nodes([node(True)], ["n3"])
    assert f.was_spare("n3", since=0.0)
    created = time.time()
    f.read_nodes([node(False)], ["n3"])  # lifted: used
    assert f.was_spare("n3", since=created) and not f.was_spare("n3", since=time.time() + 1)
    assert [e.event for e in f.entries] == ["spare"]
