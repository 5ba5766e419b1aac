"""Every input bounded: each field of every model that arrives through Temporal (workflow, update,
signal, query and activity inputs) or from a spec has a bound that fits its meaning. The walk
below fails on any integer or float without an upper bound, any string without a maximum length,
any list or map without a maximum size (and their items likewise), and any free-form value that
is not listed here with the reason it is safe."""

from __future__ import annotations

import enum
import types
import typing
from typing import Any, Literal, Union

import annotated_types as at
import pytest
from pydantic import BaseModel

from contracts import autoscale as ap
from contracts import control as cp
from contracts import cluster as cc
from contracts import drain, hosts, placement, queue, records
from contracts import estimate_inputs as ei
from contracts.deployment import InstanceEnded, ScaleAsk
from contracts.rollout import RolloutState
from contracts.host import BookingAsk
from contracts import host as ch
from contracts import host_auth as ha
from scheduler.bounds import MAX_TEXT
from scheduler.spec import ModelSpec
from scheduler.tenancy.config import TenantsFile
from contracts import agent as hp

INPUTS = [
    # workflow inputs
    cp.InstanceInput, cp.DeploymentInput, ch.HostInput, ap.AutoscalerInput,
    # signals, updates, queries
    RolloutState, cp.PreemptNotice, cp.HostNews, ch.HostReport, ch.BookingQuery, ch.BookingsQuery, hp.LogRequest,
    cp.VictimStopped, cp.CordonAsk, ScaleAsk, InstanceEnded,
    # the cluster workflow's updates (keys, and the reads through the control plane)
    cc.KeyAdd, cc.KeyRevoke, cc.Page, cc.ServingAsk, cc.AuditAsk,
    # the agent's activities (callable by anything that can schedule on a host's queue)
    hp.LaunchRequest, hp.ModelFetch, ha.WatchAsk,
    # activities the workflows call: each one's input
    ha.ReportCheck, cp.InstanceRecord, cp.PlacementPlan, cp.DecisionRecord, BookingAsk, cp.InstanceNames, cp.InstanceRef,
    ch.BookingsAsk, ch.HeldAsk, ei.HeaderRequest,
    placement.EstimateAsk, placement.PlaceAsk, placement.PreemptAsk, placement.ScaleDownAsk,
    records.SaveDeployment, records.StartInstances, hosts.HostRef, hosts.HostLost, hosts.HostCordon, hosts.ReadersAsk,
    hosts.ModelPaths, queue.TenantAsk, drain.DrainAsk, ap.DeploymentRef, ap.StepAsk, ap.ApplyAsk,
    # what the control plane answers the agent's booking checks with (the updates' results)
    ch.Booking, ch.HostBookings,
    # what a host answers that the control plane reads (activity results from a host's queue)
    ei.EstimateInputs, ei.ReaderHosts,
    # what a user writes
    ModelSpec, TenantsFile,
]

# Free-form JSON, each with why it is safe: validated into a bounded model where it is used.
FREE_FORM = {
    "InstanceInput.spec": "validated as a ModelSpec (bounded) as the workflow starts",
    "DeploymentInput.spec": "validated as a ModelSpec as the workflow starts",
    "AutoscalerInput.carry": "validated by activities/autoscale_state.py",
    "AutoscalerInput.history": "the workflow's own records; the list is bounded",
    "AutoscalerInput.cold_starts": "the workflow's own records; the list is bounded",
    "EstimateAsk.spec": "validated as a ModelSpec by the activity (valid_spec)",
    "PlaceAsk.spec": "validated as a ModelSpec by the activity (valid_spec)",
    "ReadersAsk.spec": "validated as a ModelSpec by the activity",
    "SaveDeployment.spec": "the deployment workflow's spec, validated as a ModelSpec as that workflow started",
    "StepAsk.carried": "validated by activities/autoscale_state.py (Carry); a bad one starts afresh",
    "GGUFData.metadata[item]": "a GGUF header's values (numbers, strings, arrays as type and length), read by the "
                               "scheduler's GGUF model with its own checks; the map is bounded",
    "InstanceRecord.decision": "the decision's summary, written by the workflow",
    "AuditAsk.policy[item]": "the caller's scheduler settings, validated as a PolicyConfig by the worker "
                             "(activities/cluster_reads.py); the map is bounded",
    "ModelFetch.source": "validated as a spec Source by the agent before use",
    "ReportCheck.report": "a host's report as it arrived: its MAC checked (contracts/host_proof.py), then validated "
                          "as a HostReport (bounded) by the host workflow",
    "RolloutState.good": "a spec as written, validated as a ModelSpec with the rest of the state (rollout_steps.state_from)",
}


def _bounded_above(meta: list) -> bool:
    return any(isinstance(m, (at.Le, at.Lt)) for m in meta) or any(
        isinstance(m, at.Interval) and (m.le is not None or m.lt is not None) for m in meta)


def _max_len(meta: list) -> bool:
    return any(isinstance(m, at.MaxLen) for m in meta)


def _meta_of(field) -> list:
    return list(field.metadata)


def problems(tp: Any, meta: list, where: str, seen: set) -> list[str]:
    """Why ``tp`` (with ``meta``, its constraints) is not bounded at ``where``."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(tp)
        more = []
        for e in extra:
            more += list(getattr(e, "metadata", [])) if hasattr(e, "metadata") else [e]
        return problems(base, meta + more, where, seen)
    if origin in (Union, types.UnionType):
        return [p for a in typing.get_args(tp) if a is not type(None) for p in problems(a, meta, where, seen)]
    if origin is Literal or tp is bool or tp is type(None) or (isinstance(tp, type) and issubclass(tp, enum.Enum)):
        return []
    if tp in (int, float):
        return [] if _bounded_above(meta) or any(getattr(m, "func", None).__name__ == "parse_bytes"
                                                 for m in meta if hasattr(m, "func")) else [f"{where}: no upper bound"]
    if tp is str:
        return [] if _max_len(meta) else [f"{where}: no maximum length"]
    if origin in (list, set, tuple, dict):
        out = [] if _max_len(meta) else [f"{where}: no maximum size"]
        for i, a in enumerate(typing.get_args(tp)):
            if a is not Ellipsis:
                out += problems(a, [], f"{where}[{'key' if origin is dict and i == 0 else 'item'}]", seen)
        return out
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return model_problems(tp, seen)
    if tp is Any or tp is dict or tp is list:
        return [] if where in FREE_FORM else [f"{where}: free-form ({tp})"]
    return [f"{where}: unknown type {tp!r}"]


def model_problems(model: type[BaseModel], seen: set) -> list[str]:
    if model in seen:
        return []
    seen.add(model)
    out = []
    for name, f in model.model_fields.items():
        where = f"{model.__name__}.{name}"
        if where in FREE_FORM:
            continue
        out += problems(f.annotation, _meta_of(f), where, seen)
    return out


@pytest.mark.parametrize("model", INPUTS, ids=lambda m: m.__name__)
def test_every_field_of_every_input_is_bounded(model):
    assert model_problems(model, set()) == []


# What our own code computes from a model file is clipped, never refused: refused, the decision that
# carries it would fail the estimate or place activity on every retry, and the replica would wait
# forever instead of hearing about its file. A hostile GGUF header names the architecture and sets
# the dimensions the figures come from.
@pytest.mark.parametrize("field, value, kept", [
    ("architecture", "a" * 5000, lambda v: v.startswith("a" * 100) and len(v) <= MAX_TEXT),  # cut to MAX_TEXT
    ("full_offload_vram", 2**70, lambda v: v == 2**63),   # 2^70 bytes: cut to 2^63
    ("context_size", 2**64 - 1, lambda v: v == 2**63),    # a uint64 read as is
    ("layers", 40, lambda v: v == 40),                    # an ordinary figure passes as it is
])
def test_a_model_files_figures_are_clipped_not_refused(field, value, kept):
    from contracts.decision import DecisionRecord, RequestSummary

    s = RequestSummary.model_validate({"kind": "gguf", field: value})
    assert kept(getattr(s, field))
    DecisionRecord(scheduled=False, request=s)  # the record that carries it validates too


def test_a_hosts_read_past_the_bounds_is_the_files_fault(tmp_path):
    # A GGUF header with 70,000 metadata keys (the contract keeps 65,536): the agent refuses to send
    # it, as ModelError naming the field (the instance goes ERROR with it), rather than an answer the
    # control plane could not decode. 4 layers, 64 wide: a real, tiny llama file besides.
    from temporalio.exceptions import ApplicationError

    from contracts.estimate_inputs import HeaderRequest, MAX_KEYS
    from gpuflow.demo import synthetic
    from worker_agent.model_header import ModelHeaders

    extra = {f"junk.{i}": 1 for i in range(MAX_KEYS + 4464)}  # 65,536 + 4,464 = 70,000
    path = synthetic.write_llama_gguf(str(tmp_path / "m.gguf"), n_layer=4, n_embd=64, n_ff=128, n_head=8,
                                      n_head_kv=2, n_vocab=32, ctx=256, recipe="F16", header=extra)
    with pytest.raises(ApplicationError) as e:
        ModelHeaders("h1").read(HeaderRequest(path=path, gguf=True))
    assert e.value.type == "ModelError" and e.value.non_retryable
    assert "gguf.metadata: Dictionary should have at most 65536 items" in e.value.message
