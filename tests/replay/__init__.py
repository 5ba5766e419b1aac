"""The replay corpus: histories recorded from real runs of this build (record.py, the scenarios in
scenarios.py), committed under histories/, and replayed under the sandbox by
tests/test_replay_corpus.py, so a change that breaks a workflow's determinism fails CI."""
