"""Tenancy in Kueue's terms (issue 38), in tables: today's files keep their meaning; GPU types as
flavors; a guaranteed replica's GPUs are whole; lending limits; cohorts borrow each other's unused
guarantee first and are reclaimed from first; fair sharing by dominant-resource share; the quota
reason wins over unschedulable."""

from __future__ import annotations

import pytest

from scheduler.cluster import GPU, Claim, Instance
from scheduler.request import FlatRequest
from scheduler.spec import ModelSpec
from scheduler.tenancy.admission import borrowing, over_limit, within_guarantee
from scheduler.tenancy.admit import admit, kueue_terms
from scheduler.tenancy.config import TenantsFile
from scheduler.tenancy.flavors import flavor_of, restrict
from scheduler.tenancy.lending import capacity, share
from scheduler.tenancy.preemption import Owners, victim_order
from scheduler.tenancy.queue import Waiting, quotas_of, to_wake
from scheduler.tenancy.usage import Usage, by_tenant
from scheduler.units import GiB
from tests.conftest import cluster, gpu, worker

# today's example files, as docs/formats.md and docs/user-guide/tenants.md showed them before issue 38
TODAY = [
    {"tenants": [{"name": "prod", "priority": 100, "guarantee": {"gpus": 8}, "limit": {"gpus": 32, "vram": "2 TiB"}},
                 {"name": "dev", "priority": 30, "limit": {"gpus": 16}},
                 {"name": "poc", "priority": 10, "limit": {"gpus": 4}, "requests_per_s": 20, "max_concurrent": 8}],
     "queueing": "BestEffortFIFO"},
    {"tenants": [{"name": "prod", "priority": 100, "guarantee": {"gpus": 4}},
                 {"name": "dev", "priority": 30, "limit": {"gpus": 6}},
                 {"name": "poc", "priority": 10, "limit": {"gpus": 2, "vram": "40 GiB"}}]},
]


def spec(name, gib=20, n=None):
    d = {"name": name, "backend": "custom", "run_command": "serve {port} {gpu_indexes}",
         "source": {"local_path": "/m"}, "resources": {"vram": f"{gib} GiB", "ram": 0}}
    if n:
        d["gpu_selector"] = {"gpus_per_replica": n}
    return ModelSpec.model_validate(d)


def req(gib=20):
    return FlatRequest(vram=gib * GiB, ram=0)


def g(i, name, gib=80):
    return GPU(index=i, vram_total=gib * GiB, name=name)


def held(name, model, w, gpus, gib=20):
    gs = gpus if isinstance(gpus, list) else [gpus]
    return Instance(name=name, model=model, worker=w, gpu_indexes=gs, claim=Claim(vram={i: gib * GiB for i in gs}))


def tf(*tenants, **kw):
    return TenantsFile.model_validate({"tenants": list(tenants), **kw})


def owners(**tenant_of):
    return Owners({f"{t}-m": t for t in tenant_of.values()} | {k.replace("_", "-"): v for k, v in tenant_of.items()},
                  {}, {})


@pytest.mark.parametrize("doc", TODAY)
def test_todays_files_keep_their_meaning(doc):
    f = TenantsFile.model_validate(doc)
    assert not f.fair_sharing
    for t in f.tenants:
        assert (t.cohort, t.lending_limit, t.flavors, t.weight) == (None, None, None, 1.0)
        assert t.guaranteed() == t.guarantee.named()  # no flavors: the guarantee as named
    snap = cluster([worker("h", 64, [g(0, "NVIDIA H100"), g(1, "NVIDIA A100")])])
    assert all(restrict(snap, t) is snap for t in f.tenants)  # every GPU model, as before
    prod = f.get("prod")
    assert within_guarantee(prod, Usage(gpus=3), Usage(gpus=1)) and not borrowing(prod, Usage(gpus=4))
    assert borrowing(f.get("dev"), Usage(gpus=1))  # no guarantee: borrows whatever it uses


@pytest.mark.parametrize("doc, error", [
    ({"name": "a", "guarantee": {"gpus": 2}, "lending_limit": {"gpus": 3}}, "lending_limit gpus 3 is above its guarantee 2"),
    ({"name": "a", "lending_limit": {"gpus": 1}}, "lending_limit gpus names a resource its guarantee does not"),
    ({"name": "a", "flavors": {"H100": {"guarantee": {"gpus": 4}, "limit": {"gpus": 2}}}}, "flavor H100 guarantee gpus 4"),
    ({"name": "a", "flavors": {"H1/00": {}}}, "is not a GPU model name"),
    ({"name": "a", "cohort": "Lab"}, "pattern"),
    ({"name": "a", "weight": -1}, "greater than or equal to 0"),
])
def test_new_fields_errors(doc, error):
    with pytest.raises(ValueError, match=error):
        tf(doc)


@pytest.mark.parametrize("keys, gpu_name, flavor", [
    (None, "anything", "*"),                              # no flavors: every model
    (["H100"], "NVIDIA H100 80GB HBM3", "H100"),          # a word of the name, any case
    (["h100"], "NVIDIA H100 80GB HBM3", "h100"),
    (["H100"], "NVIDIA H1000", None),                     # not a word: not that model, and no "*"
    (["H100", "*"], "NVIDIA A100-SXM4-80GB", "*"),        # "*": every other model
    (["A100", "*"], "NVIDIA A100-SXM4-80GB", "A100"),     # '-' ends a word
])
def test_flavor_of(keys, gpu_name, flavor):
    t = tf({"name": "a", **({"flavors": {k: {} for k in keys}} if keys else {})}).get("a")
    assert flavor_of(t, gpu_name) == flavor


def mixed():
    return [worker("w-a100", 256, [g(0, "NVIDIA A100"), g(1, "NVIDIA A100")]),
            worker("w-h100", 256, [g(0, "NVIDIA H100"), g(1, "NVIDIA H100")])]


def test_a_flavor_limited_tenant_gets_only_its_gpu_model():
    f = tf({"name": "h", "flavors": {"H100": {"limit": {"gpus": 2}}}}, {"name": "any"})
    o = owners(h="h", any="any")
    snap = cluster(mixed())
    a = admit(snap, spec("h-m"), req(), f, o, "h-m-0")  # binpack alone would take w-a100 (first by name)
    assert a.decision.placement.worker == "w-h100" and a.quota is None
    assert admit(snap, spec("any-m"), req(), f, o, "any-m-0").decision.placement.worker == "w-a100"
    # h holds both H100s: 2 + 1 > 2, the A100s are free but not its model: the flavor's quota, not a placement
    snap = cluster(mixed(), [held("h-m-0", "h-m", "w-h100", 0), held("h-m-1", "h-m", "w-h100", 1)])
    a = admit(snap, spec("h-m"), req(), f, o, "h-m-2")
    assert a.quota == "quota: tenant h uses 2 of its 2 H100 GPUs (this replica needs 1)"


def test_four_h100_and_eight_of_anything():
    r = tf({"name": "r", "limit": {"gpus": 8}, "flavors": {"H100": {"guarantee": {"gpus": 4}}, "*": {}}}).get("r")
    assert r.guaranteed() == {"gpus": 4}  # the flavors' guarantees summed, for checks that know no models
    # 3 H100 held + 1 H100 = 4 <= 4: within its guarantee; an A100 ("*", no guarantee, none overall): borrowing
    assert within_guarantee(r, Usage(gpus=3), Usage(gpus=1), {"H100": Usage(gpus=3)}, {"H100": Usage(gpus=1)})
    assert not within_guarantee(r, Usage(gpus=3), Usage(gpus=1), {"H100": Usage(gpus=3)}, {"*": Usage(gpus=1)})
    assert borrowing(r, Usage(gpus=1), {"*": Usage(gpus=1)}) and not borrowing(r, Usage(gpus=4), {"H100": Usage(gpus=4)})
    # 8 of anything: 4 H100 + 4 others held, one more of either is over the overall limit
    assert over_limit(r, Usage(gpus=8), Usage(gpus=1), {"H100": Usage(gpus=4), "*": Usage(gpus=4)},
                      {"*": Usage(gpus=1)}) == "quota: tenant r uses 8 of its 8 GPUs (this replica needs 1)"


GUARANTEE = tf({"name": "prod", "guarantee": {"gpus": 2}}, {"name": "dev"})
OWN = Owners({"prod-m": "prod", "dev-m": "dev"}, {}, {})


def test_a_guaranteed_replica_does_not_share_a_gpu_with_a_borrower():
    # 2 GPUs x 80 GiB; dev (no guarantee: a borrower) holds 40 GiB of GPU 1. prod (guarantee 2 GPUs)
    # wants 100 GiB over 2 GPUs. Before: GPUs 0 and 1 split by what is free, 80 : 40, so
    # 66.67 + 33.33 GiB, the smaller half beside dev's 40 GiB. Now it does not see GPU 1 (a
    # borrower's): it preempts dev and holds 50 + 50 GiB alone.
    snap = cluster([worker("h", 256, [gpu(0, 80), gpu(1, 80)])], [held("dev-m-0", "dev-m", "h", 1, 40)])
    a = admit(snap, spec("prod-m", 100, 2), req(100), GUARANTEE, OWN, "prod-m-0")
    assert a.victims == ["dev-m-0"]
    assert {i: v / GiB for i, v in a.decision.placement.claim.vram.items()} == {0: 50.0, 1: 50.0}


def test_a_borrower_does_not_share_a_guaranteed_replicas_gpu():
    # prod's guaranteed replica holds 60 + 40 GiB of GPUs 0 and 1 (80 GiB each); dev's 20 GiB
    # replica would fit beside it (binpack: GPU 0), but a borrower does not see those GPUs
    snap = cluster([worker("h", 256, [gpu(0, 80), gpu(1, 80)])],
                   [Instance(name="prod-m-0", model="prod-m", worker="h", gpu_indexes=[0, 1],
                             claim=Claim(vram={0: 60 * GiB, 1: 40 * GiB}))])
    a = admit(snap, spec("dev-m"), req(), GUARANTEE, OWN, "dev-m-0")
    assert not a.decision.scheduled and a.victims == []
    assert any(n.startswith("tenancy: 2 GPU(s) hold other tenants' guaranteed replicas") for n in a.notes)
    # one more, empty GPU: it goes there
    snap = snap.model_copy(update={"workers": [worker("h", 256, [gpu(0, 80), gpu(1, 80), gpu(2, 80)])]})
    assert admit(snap, spec("dev-m"), req(), GUARANTEE, OWN, "dev-m-0").decision.placement.gpu_indexes == [2]


LENDERS = tf({"name": "a"}, {"name": "b", "guarantee": {"gpus": 2}, "lending_limit": {"gpus": 0}},
             {"name": "c", "guarantee": {"gpus": 2}, "lending_limit": {"gpus": 1}})


@pytest.mark.parametrize("a_holds, quota", [
    # 6 GPUs; b keeps min(2 - 0, 2 - 0) = 2, c keeps min(2 - 1, 2 - 0) = 1: 3 must stay free
    (1, None),  # a's second: 6 - 2 = 4 free >= 3
    (2, None),  # a's third: 6 - 3 = 3 free >= 3
    (3, "quota: tenant a would borrow what others keep of their guarantees (b keeps 2 GPUs, c keeps 1 GPU; "
        "2 GPUs would be left free)"),  # a's fourth: 6 - 4 = 2 < 3
])
def test_lending_limits_keep_part_of_a_guarantee_free(a_holds, quota):
    snap = cluster([worker("h", 256, [gpu(i, 24) for i in range(6)])],
                   [held(f"a-m-{k}", "a-m", "h", k) for k in range(a_holds)])
    o = Owners({"a-m": "a", "b-m": "b", "c-m": "c"}, {}, {})
    adm = admit(snap, spec("a-m"), req(), LENDERS, o, f"a-m-{a_holds}")
    assert adm.decision.scheduled and adm.quota == quota


def three_models():
    return [worker("w-y", 256, [g(0, "Y"), g(1, "Y")]), worker("w-x", 256, [g(0, "X"), g(1, "X")]),
            worker("w-z", 256, [g(0, "Z"), g(1, "Z")])]


@pytest.mark.parametrize("a_cohort, b_uses_x, where", [
    # b (cohort lab) guarantees 2 X GPUs, c 2 Y GPUs, nobody Z; all unused. Binpack alone: w-y (first by name)
    ("lab", 0, "w-x"),   # a in b's cohort borrows b's unused X first
    (None, 0, "w-z"),    # a in no cohort: GPUs nobody's unused guarantee covers first (Z)
    ("lab", 2, "w-z"),   # b uses its 2 X: nothing of the cohort's unused; then Z
])
def test_a_cohort_borrows_its_mates_unused_guarantee_first(a_cohort, b_uses_x, where):
    f = tf({"name": "a", **({"cohort": a_cohort} if a_cohort else {})},
           {"name": "b", "cohort": "lab", "flavors": {"X": {"guarantee": {"gpus": 2}}}},
           {"name": "c", "flavors": {"Y": {"guarantee": {"gpus": 2}}}})
    o = Owners({"a-m": "a", "b-m": "b", "c-m": "c"}, {}, {})
    snap = cluster(three_models(), [held(f"b-m-{k}", "b-m", "w-x", k) for k in range(b_uses_x)])
    assert admit(snap, spec("a-m"), req(), f, o, "a-m-0").decision.placement.worker == where


@pytest.mark.parametrize("cohort, first", [
    # b reclaims; a and d both borrow. a is b's cohort mate: a first, though d has the lower priority
    ("lab", "a-m-0"),
    (None, "d-m-0"),   # no cohort: lower tenant priority first, as before
])
def test_reclaim_takes_from_the_cohort_first(cohort, first):
    f = tf({"name": "a", "priority": 50, **({"cohort": cohort} if cohort else {})},
           {"name": "b", "guarantee": {"gpus": 2}, **({"cohort": cohort} if cohort else {})},
           {"name": "d", "priority": 10})
    o = Owners({"a-m": "a", "b-m": "b", "d-m": "d"}, {}, {})
    insts = [held("a-m-0", "a-m", "h", 0), held("d-m-0", "d-m", "h", 1)]
    used = by_tenant(insts, o.tenant_of)
    assert victim_order(insts, f, o, "b", used)[0].name == first


@pytest.mark.parametrize("guarantee, weight, used, want", [
    # capacity 8 GPUs, 640 GiB: share = max over resources of (use above guarantee) / capacity, / weight
    (0, 1, Usage(gpus=2, vram=40 * GiB), 0.25),      # max(2/8, 40/640) = 0.25
    (0, 2, Usage(gpus=2, vram=40 * GiB), 0.125),     # / weight 2
    (2, 1, Usage(gpus=3), 0.125),                    # (3 - 2) / 8
    (2, 1, Usage(gpus=2), 0.0),                      # within its guarantee: borrows nothing
    (0, 0, Usage(gpus=1), float("inf")),             # weight 0
])
def test_dominant_resource_share(guarantee, weight, used, want):
    t = tf({"name": "t", "weight": weight, **({"guarantee": {"gpus": guarantee}} if guarantee else {})}).get("t")
    cap = capacity(cluster([worker("h", 0, [gpu(i, 80) for i in range(8)])]))
    assert share(t, used, cap) == want


@pytest.mark.parametrize("fair, woken", [
    (True, "b-m-1"),   # a borrows 2 of 4 GPUs (share 0.5), b 1 (0.25): b first, though a arrived first
    (False, "a-m-2"),  # without fair sharing: arrival
])
def test_fair_sharing_admits_the_lowest_share_first(fair, woken):
    f = tf({"name": "a"}, {"name": "b"}, fair_sharing=fair)
    insts = [held("a-m-0", "a-m", "h", 0), held("a-m-1", "a-m", "h", 1), held("b-m-0", "b-m", "h", 2)]
    snap = cluster([worker("h", 256, [gpu(i, 24) for i in range(4)])], insts)
    tenant_of = {"a-m": "a", "b-m": "b"}
    q = [Waiting("a-m-2", "a-m", arrived=1.0, tenant="a"), Waiting("b-m-1", "b-m", arrived=2.0, tenant="b")]
    specs = {d: (spec(d), req()) for d in ("a-m", "b-m")}
    w = to_wake(snap, q, specs, quotas=quotas_of(snap, f, tenant_of))
    assert w.woken == [woken]


def test_fair_sharing_orders_again_after_each_replica_it_wakes():
    # 8 GPUs, nothing guaranteed: every replica borrows. a holds 1 GPU (share 1/8), b holds 2 (2/8).
    # a's 3 replicas arrived first. Woken one at a time by the share then: a-m-1 (a 1/8 < b 2/8), then
    # a is at 2/8 = b's and a-m-2 arrived first, then a at 3/8 > b's 2/8: b-m-1, then a-m-3 (3/8 = 3/8, a first).
    # A fixed order (a's shares before the pass) woke all of a's three first.
    f = tf({"name": "a"}, {"name": "b"}, fair_sharing=True)
    insts = [held("a-m-0", "a-m", "h", 0), held("b-m-0", "b-m", "h", 1), held("b-x-0", "b-x", "h", 2)]
    snap = cluster([worker("h", 256, [gpu(i, 24) for i in range(8)])], insts)
    tenant_of = {"a-m": "a", "b-m": "b", "b-x": "b"}
    q = [Waiting(f"a-m-{i}", "a-m", arrived=float(i), tenant="a") for i in (1, 2, 3)] + \
        [Waiting("b-m-1", "b-m", arrived=10.0, tenant="b")]
    specs = {d: (spec(d), req()) for d in ("a-m", "b-m")}
    w = to_wake(snap, q, specs, quotas=quotas_of(snap, f, tenant_of))
    assert w.woken == ["a-m-1", "a-m-2", "b-m-1", "a-m-3"]


def test_fair_sharing_preempts_the_highest_share_first():
    # b reclaims; a and d borrow with equal priority; a borrows 2 GPUs, d 1: a's share is higher
    f = tf({"name": "a"}, {"name": "b", "guarantee": {"gpus": 2}}, {"name": "d"}, fair_sharing=True)
    o = Owners({"a-m": "a", "b-m": "b", "d-m": "d"}, {}, {"d-m-0": 2.0})  # d's is the newest
    insts = [held("a-m-0", "a-m", "h", 0), held("a-m-1", "a-m", "h", 1), held("d-m-0", "d-m", "h", 2)]
    snap = cluster([worker("h", 256, [gpu(i, 24) for i in range(3)])], insts)
    used = by_tenant(insts, o.tenant_of)
    assert victim_order(insts, f, o, "b", used, capacity(snap))[0].name.startswith("a-m")
    assert victim_order(insts, f, o, "b", used)[0].name == "d-m-0"  # off: the newest first, as before


def test_the_quota_reason_wins_over_unschedulable():
    # 3 GPUs, all held; poc (limit 2) holds 2 of them. Its third does not fit, and would break its
    # quota even on an empty cluster: the queue says the quota (it said unschedulable before)
    f = tf({"name": "poc", "limit": {"gpus": 2}}, {"name": "dev"})
    insts = [held("poc-m-0", "poc-m", "h", 0), held("poc-m-1", "poc-m", "h", 1), held("dev-m-0", "dev-m", "h", 2)]
    snap = cluster([worker("h", 256, [gpu(i, 24) for i in range(3)])], insts)
    tenant_of = {"poc-m": "poc", "dev-m": "dev"}
    q = [Waiting("poc-m-2", "poc-m", tenant="poc"), Waiting("dev-m-1", "dev-m", tenant="dev")]
    w = to_wake(snap, q, {d: (spec(d), req()) for d in tenant_of}, quotas=quotas_of(snap, f, tenant_of))
    assert w.held["poc-m-2"] == "quota: tenant poc uses 2 of its 2 GPUs (this replica needs 1)"
    assert w.held["dev-m-1"].startswith("unschedulable:")  # capacity is what blocks dev
    assert not kueue_terms(f)  # limits alone: admission's fast path, as before


def test_the_live_scenario_in_one_process():
    # tests/test_tenancy_kueue_live.py's cluster: h1 2 x 40G (c guarantees them), h2 2 x 48G (b,
    # cohort lab), h3 2 x 56G (a, cohort lab); replicas of 30 GiB, one a GPU. Binpack alone puts
    # one on h1 (the fullest fit). a's first two go to its own 56G (its unused flavor guarantee
    # first), its third borrows b's unused 48G (its cohort mate's), not c's 40G.
    def host(n, size):
        return worker(n, 256, [g(0, f"Simulated {size}G", size), g(1, f"Simulated {size}G", size)])
    f = tf({"name": "a", "cohort": "lab", "flavors": {"56G": {"guarantee": {"gpus": 2}}, "*": {}}},
           {"name": "b", "cohort": "lab", "flavors": {"48G": {"guarantee": {"gpus": 2}}, "*": {}}},
           {"name": "c", "flavors": {"40G": {"guarantee": {"gpus": 2}}, "*": {}}})
    o = Owners({"a-m": "a", "b-m": "b", "c-m": "c"}, {}, {})
    snap = cluster([host("h1", 40), host("h2", 48), host("h3", 56)])
    where = []
    for k in range(3):
        a = admit(snap, spec("a-m", 30), req(30), f, o, f"a-m-{k}")
        p = a.decision.placement
        where.append(p.worker)
        snap = snap.model_copy(update={"instances": [*snap.instances, held(f"a-m-{k}", "a-m", p.worker, p.gpu_indexes, 30)]})
        o.started_at[f"a-m-{k}"] = float(k)
    assert where == ["h3", "h3", "h2"]
    # b wants its 2 x 48G back: its first goes on the free 48G, its second preempts a's borrower
    a = admit(snap, spec("b-m", 30), req(30), f, o, "b-m-0")
    assert a.decision.placement.worker == "h2" and a.victims == []
    snap = snap.model_copy(update={"instances": [*snap.instances, held("b-m-0", "b-m", "h2", a.decision.placement.gpu_indexes, 30)]})
    a = admit(snap, spec("b-m", 30), req(30), f, o, "b-m-1")
    assert a.victims == ["a-m-2"] and a.preemption.why == "to reclaim b's guarantee"
    snap = snap.model_copy(update={"instances": [i for i in snap.instances if i.name != "a-m-2"]
                                   + [held("b-m-1", "b-m", "h2", a.decision.placement.gpu_indexes, 30)]})
    # a's third again: the cohort has nothing unused left; only then c's 40G (whole, rather than
    # slivers of a's own 56G)
    assert admit(snap, spec("a-m", 30), req(30), f, o, "a-m-2").decision.placement.worker == "h1"


def test_the_queue_wakes_a_flavor_guarantee_to_reclaim():
    # b guarantees 2 X GPUs; a (no guarantee) borrows both. b's waiting replica does not fit, but
    # it is within b's X guarantee (0 + 1 <= 2) while a borrows: woken to preempt
    f = tf({"name": "a"}, {"name": "b", "flavors": {"X": {"guarantee": {"gpus": 2}}}})
    snap = cluster([worker("w-x", 256, [g(0, "X"), g(1, "X")])],
                   [held("a-m-0", "a-m", "w-x", 0, 70), held("a-m-1", "a-m", "w-x", 1, 70)])
    tenant_of = {"a-m": "a", "b-m": "b"}
    w = to_wake(snap, [Waiting("b-m-0", "b-m", tenant="b")], {"b-m": (spec("b-m", 30), req(30))},
                quotas=quotas_of(snap, f, tenant_of))
    assert w.reclaim == ["b-m-0"]


def test_the_queue_does_not_wake_a_borrower_beside_a_guaranteed_replica():
    # prod's guaranteed replica holds 60 GiB of GPU 0 (80 GiB); dev's 20 GiB replica would fit
    # beside it, but a borrower is not placed there (admit.py rule 5): the queue holds it, saying
    # why, rather than waking it to be refused
    f = tf({"name": "prod", "guarantee": {"gpus": 1}}, {"name": "dev"})
    snap = cluster([worker("h", 256, [gpu(0, 80)])], [held("prod-m-0", "prod-m", "h", 0, 60)])
    tenant_of = {"prod-m": "prod", "dev-m": "dev"}
    w = to_wake(snap, [Waiting("dev-m-0", "dev-m", tenant="dev")], {"dev-m": (spec("dev-m"), req())},
                quotas=quotas_of(snap, f, tenant_of))
    assert w.woken == [] and w.held["dev-m-0"].endswith("a borrowing replica does not share them")
    # without the guarantee, as before: woken
    f = tf({"name": "prod"}, {"name": "dev"})
    assert to_wake(snap, [Waiting("dev-m-0", "dev-m", tenant="dev")], {"dev-m": (spec("dev-m"), req())},
                   quotas=quotas_of(snap, f, tenant_of)).woken == ["dev-m-0"]


@pytest.mark.parametrize("a_holds, woken", [(2, True), (3, False)])
def test_the_queue_holds_a_borrower_by_the_lending_limits(a_holds, woken):
    # test_lending_limits_keep_part_of_a_guarantee_free through the queue: 3 GPUs must stay free of 6
    snap = cluster([worker("h", 256, [gpu(i, 24) for i in range(6)])],
                   [held(f"a-m-{k}", "a-m", "h", k) for k in range(a_holds)])
    tenant_of = {"a-m": "a", "b-m": "b", "c-m": "c"}
    w = to_wake(snap, [Waiting(f"a-m-{a_holds}", "a-m", tenant="a")], {"a-m": (spec("a-m"), req())},
                quotas=quotas_of(snap, LENDERS, tenant_of))
    assert (w.woken == [f"a-m-{a_holds}"]) == woken
    if not woken:
        assert w.held[f"a-m-{a_holds}"].startswith("quota: tenant a would borrow what others keep")
