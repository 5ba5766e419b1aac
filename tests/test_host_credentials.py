"""The credentials at both ends, on real files and real stores: the cluster's keys made once in the
store (two workers racing make one), a host's joins and forgets there; an agent's credential made
from the join token at its first start, kept 0600 in its data folder, locked while it runs, and
agreeing with the control plane on the key they share."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from contracts import credential as cr
from scheduler.errors import InvalidInput
from store import db, host_credentials as hc
from worker_agent.credential import FILE, HostCredential, open_credential, read_token


# -- the store's side -------------------------------------------------------------------------------

def test_the_cluster_keys_are_made_once_and_the_token_pins_them(store):
    _, _, engine = store
    keys = hc.ensure_cluster(engine)  # init_db made them: the same ones again
    assert hc.ensure_cluster(engine) == keys == hc.cluster_keys(engine)
    secret, cluster_public = cr.parse_join_token(hc.join_token(engine))
    assert (secret, cluster_public) == (keys.join_secret, keys.public)
    assert cr.public_of(keys.secret) == keys.public


def test_two_workers_racing_on_a_fresh_store_make_one_pair_of_keys(tmp_path):
    url = db.sqlite_url(str(tmp_path / "gpuflow.db"))
    engines = [db.make_engine(url) for _ in range(4)]  # four processes' engines, one file
    got, start = [], threading.Barrier(4)

    def worker(engine):
        start.wait()
        db.init_db(engine)
        got.append(hc.cluster_keys(engine))

    threads = [threading.Thread(target=worker, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and len(set(got)) == 1  # each read the one row the first writer made
    for e in engines:
        e.dispose()


def test_a_host_joins_once_and_a_second_key_waits_for_forget(store):
    _, _, engine = store
    a, b = cr.public_of(os.urandom(32)), cr.public_of(os.urandom(32))
    assert hc.known(engine, "h1") is None
    assert hc.accept(engine, "h1", a, 1000, "m1")
    assert hc.known(engine, "h1") == hc.Known(public=a, hello_ms=1000, hello_mac="m1")
    assert hc.accept(engine, "h1", a)  # a watch of a joined host: nothing about hellos changes
    assert hc.accept(engine, "h1", a, 900, "old")  # an older stamp never moves the record back
    assert hc.known(engine, "h1").hello_ms == 1000
    assert not hc.accept(engine, "h1", b, 2000, "m2")  # a second key: refused, nothing written
    assert hc.known(engine, "h1").public == a
    assert hc.forget(engine, "h1") and not hc.forget(engine, "h1")
    assert hc.accept(engine, "h1", b, 2000, "m2") and hc.known(engine, "h1").public == b  # forgotten: b joins


def test_many_hosts_are_read_as_each_alone(store):
    """known_many (one query, for host_keys' batches) answers as known does, host by host: a host
    that never joined, or was forgotten, is absent; a rejoin under a new key shows the new key."""
    _, _, engine = store
    a, b, c = (cr.public_of(os.urandom(32)) for _ in range(3))
    assert hc.accept(engine, "h1", a, 1000, "m1") and hc.accept(engine, "h2", b) and hc.accept(engine, "h3", c)
    assert hc.forget(engine, "h3") and hc.accept(engine, "h3", a)  # h3 rejoined under a
    assert hc.forget(engine, "h2")
    names = ["h1", "h2", "h3", "never"]
    assert hc.known_many(engine, names) == {n: hc.known(engine, n) for n in names if hc.known(engine, n)}
    assert hc.known_many(engine, names) == {"h1": hc.Known(public=a, hello_ms=1000, hello_mac="m1"),
                                            "h3": hc.Known(public=a, hello_ms=0, hello_mac="")}
    assert hc.known_many(engine, []) == {}


# -- the agent's side -------------------------------------------------------------------------------

def token_and_keys():
    secret, join = os.urandom(32), os.urandom(32)
    return cr.join_token(join, cr.public_of(secret)), secret, join


def test_the_first_start_joins_and_later_starts_need_no_token(tmp_path):
    token, cluster_secret, join = token_and_keys()
    folder = str(tmp_path / "agent" / "h1")
    with pytest.raises(InvalidInput, match="host h1 has not joined this cluster yet.*gpuflow hosts join-token"):
        open_credential(folder, "h1")
    first = open_credential(folder, "h1", token)
    path = os.path.join(folder, FILE)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert token.split(".")[1] not in open(path).read()  # the join secret is not kept, only the proof
    # both ends make the same key: the agent from its private key and the cluster's public key, the
    # control plane from the cluster's private key and the host's public key
    assert first.key == cr.host_key(cluster_secret, first.public)
    assert cr.verify_join(join, "h1", first.public, first.proof)
    first.close()
    again = open_credential(folder, "h1")
    assert (again.public, again.key, again.proof) == (first.public, first.key, first.proof)
    again.close()


def test_two_agents_cannot_share_one_folder(tmp_path):
    token, _, _ = token_and_keys()
    folder = str(tmp_path / "h1")
    first = open_credential(folder, "h1", token)
    with pytest.raises(InvalidInput, match=rf"another agent \(pid {os.getpid()}\) runs on {folder} already"):
        open_credential(folder, "h1", token)
    first.close()  # the first stops: the next may start
    open_credential(folder, "h1").close()


@pytest.mark.parametrize("case,setup,name,token,words", [
    ("another host's credential", None, "h2", None, "is host 'h1''s credential, not 'h2''s"),
    ("another cluster's token", None, "h1", "other", "the join token is another cluster's"),
    ("readable by others", 0o644, "h1", None, "is readable by others (mode 644)"),
    ("a token that is not one", "fresh", "h1", "gfjoin1.abc.def",
     "the join token: the join token's secret is not 32 bytes"),
    ("a token of another form", "fresh", "h1", "hello", "the join token: a join token has the form"),
])
def test_a_credential_that_is_not_this_hosts_is_named(tmp_path, case, setup, name, token, words):
    good, _, _ = token_and_keys()
    folder = str(tmp_path / "h")
    if setup != "fresh":
        open_credential(folder, "h1", good).close()
    if isinstance(setup, int):
        os.chmod(os.path.join(folder, FILE), setup)
    token = token_and_keys()[0] if token == "other" else token
    with pytest.raises(InvalidInput) as e:
        open_credential(folder, name, token)
    assert words in str(e.value), str(e.value)
    if isinstance(setup, int):
        os.chmod(os.path.join(folder, FILE), 0o600)
    open_credential(folder, "h1", good if setup == "fresh" else None).close()  # the lock was let go


def test_read_token_from_the_flag_or_a_file(tmp_path):
    f = tmp_path / "token"
    f.write_text("gfjoin1.x.y\n")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert read_token(" t ", str(f)) == "t"  # the value itself wins
    assert read_token(None, str(f)) == "gfjoin1.x.y"
    assert read_token(None, None) is None
    with pytest.raises(InvalidInput, match="is empty"):
        read_token(None, str(empty))
    with pytest.raises(InvalidInput, match="No such file"):
        read_token(None, str(tmp_path / "none"))


def test_engine_keys_come_from_the_shared_key(tmp_path):
    token, cluster_secret, _ = token_and_keys()
    cred: HostCredential = open_credential(str(tmp_path / "h"), "h1", token)
    control_side = cr.engine_key(cr.host_key(cluster_secret, cred.public), "m-0", "", "n1")
    assert cred.engine_key("m-0", "", "n1") == control_side != cred.engine_key("m-0", "", "n2")
    cred.close()
