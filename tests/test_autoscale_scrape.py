"""Engine and gateway metrics, as the engines print them, turned into the autoscaler's windows."""

from __future__ import annotations

import pytest

from scheduler.autoscale.scrape import parse, window

VLLM = """# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} 0.5
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.05",model_name="m"}} {b1}
vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.1",model_name="m"}} {b2}
vllm:inter_token_latency_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {n}
vllm:inter_token_latency_seconds_count{{engine="0",model_name="m"}} {n}
vllm:inter_token_latency_seconds_sum{{engine="0",model_name="m"}} {total}
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} 999
vllm:time_per_output_token_seconds_count{{engine="0",model_name="m"}} 999
vllm:time_per_output_token_seconds_sum{{engine="0",model_name="m"}} 999
"""


def vllm(waiting, b1, b2, n, total):
    return VLLM.format(waiting=waiting, b1=b1, b2=b2, n=n, total=total)


def test_vllm_window_from_two_scrapes():
    a = parse(vllm(3, 10, 20, 20, 1.0))
    b = parse(vllm(9, 10, 40, 50, 3.4))
    w = window(a, b)
    # waiting is a gauge: now 9. TPOT window: 30 tokens (50 - 20), 2.4 s (3.4 - 1.0): mean 80 ms;
    # the newer inter_token_latency name wins over the deprecated one (whose 999s are ignored)
    assert (w.waiting, w.running, w.ok) == (9, 4, True)
    assert w.tpot.count == 30 and w.tpot.sum == pytest.approx(2.4)
    assert a.gauges["kv_usage"] == 0.5


def test_engine_restart_between_scrapes():
    a = parse(vllm(0, 100, 200, 200, 20.0))
    b = parse(vllm(0, 1, 2, 2, 0.1))  # the engine restarted: counters fell
    assert window(a, b).tpot.count == 2  # since the restart, never -198


def test_first_scrape_and_failed_scrape():
    assert window(None, parse(vllm(1, 1, 1, 1, 0.1))).tpot is None  # one scrape: no window yet
    assert window(None, None).ok is False


def test_sglang_and_llama_cpp_names():
    sg = parse("# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 5\n"
               "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 2\n")
    lc = parse("# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 3\n"
               "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n")
    assert (sg.gauges["waiting"], sg.gauges["running"]) == (5, 2)
    assert (lc.gauges["waiting"], lc.gauges["running"]) == (3, 1)


def test_gateway_metrics_for_one_model():
    text = ("# TYPE gpuflow_gateway_queue_depth gauge\n"
            'gpuflow_gateway_queue_depth{model="chat"} 7\ngpuflow_gateway_queue_depth{model="embed"} 2\n'
            "# TYPE gpuflow_gateway_request_duration_seconds histogram\n"
            'gpuflow_gateway_request_duration_seconds_bucket{model="chat",le="0.5"} 4\n'
            'gpuflow_gateway_request_duration_seconds_bucket{model="chat",le="+Inf"} 5\n'
            'gpuflow_gateway_request_duration_seconds_count{model="chat"} 5\n'
            'gpuflow_gateway_request_duration_seconds_sum{model="chat"} 2.0\n')
    chat = parse(text, model="chat")
    assert chat.gauges["waiting"] == 7  # embed's 2 is not chat's
    assert chat.histograms["latency"].count == 5
