"""Where a step's time goes: XLA operations sorted into kinds of work by the JAX
operation that made them."""

import pytest

from beyondpar.benchmarks import step_profile

COMPILED = """
HloModule jit_step_fn

%fused_computation.3 (param_0: f32[4,4]) -> f32[4,4] {
  %param_0 = f32[4,4]{1,0} parameter(0)
  ROOT %exp.1 = f32[4,4] exponential(%param_0), metadata={op_name="jit(f)/jvp(T)/l0/attn/exp"}
}

ENTRY %main {
  %ynn_fusion.2 = f32[4,4] fusion(%p), metadata={op_name="jit(f)/transpose(jvp(T))/dot_general"}
  %copy.7 = f32[4,4]{1,0} copy(%p)
  ROOT %all-reduce.1 = f32[4,4] all-reduce(%p), metadata={op_name="jit(f)/(transpose(x):y)"}
}
"""


def test_op_names_map_each_instruction_to_its_jax_operation():
    names = step_profile.op_names(COMPILED)
    assert names["ynn_fusion.2"] == "jit(f)/transpose(jvp(T))/dot_general"
    assert names["exp.1"] == "jit(f)/jvp(T)/l0/attn/exp"
    assert names["copy.7"] is None  # made by the compiler, without an op_name
    assert "all-reduce.1" in names


@pytest.mark.parametrize(
    "instruction, op_name, kind",
    [
        ("all-reduce.3", "jit(f)/transpose(jvp(T))/head/dot_general", "gradient all-reduce"),
        ("psum.14", "jit(f)/shard_map/psum", "gradient all-reduce"),
        ("psum_scatter.2", "jit(f)/shard_map/psum_scatter", "gradient all-reduce"),
        ("all-gather.4", "jit(f)/jvp(T)/layers_1/mlp/dot_general", "gradient all-reduce"),
        ("f.6", "jit(f)/shard_map/transpose(jvp(T))/l0/attn/psum_of_x/mul", "backward: norms"),
        ("dot.1", "jit(f)/jvp(T)/layers_1/attn/query/dot_general", "forward: matmuls"),
        ("dot.2", "jit(f)/transpose(jvp(T))/layers_1/mlp/dot_general", "backward: matmuls"),
        ("f.1", "jit(f)/jvp(T)/layers_0/attn/reduce_max", "forward: attention softmax"),
        ("f.2", "jit(f)/transpose(jvp(T))/layers_0/attn/Dropout_0/select_n", "backward: attention"),
        ("f.7", "jit(f)/jvp(T)/layers_0/attn/Dropout_0", "forward: attention softmax"),
        ("f.3", "jit(f)/jvp(T)/layers_0/ln1/mul", "forward: norms"),
        ("f.4", "jit(f)/transpose(jvp(T))/layers_0/attn/query/add", "backward: norms"),
        ("f.5", "jit(f)/mul", "optimiser update"),
        ("copy.1", None, "other operations"),
    ],
)
def test_category_reads_the_pass_and_the_work_from_the_op_name(instruction, op_name, kind):
    assert step_profile.category(instruction, op_name).startswith(kind)


def test_breakdown_is_per_step_and_device_largest_first():
    names = {"dot.1": "jit(f)/jvp(T)/x/dot_general", "f.1": "jit(f)/jvp(T)/ln1/mul"}
    events = [
        {"ph": "X", "name": "dot.1", "dur": 3000.0},  # microseconds
        {"ph": "X", "name": "dot.1", "dur": 1000.0},
        {"ph": "X", "name": "f.1", "dur": 6000.0},
        {"ph": "X", "name": "$train.py:1 run", "dur": 1e6},  # a Python frame
        {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 1e6},  # a host span
        {"ph": "i", "name": "dot.1", "dur": 1e6},  # not a complete event
    ]
    got = step_profile.breakdown(events, names, steps=2, devices=2)
    assert list(got) == ["forward: norms, activations, biases, residuals, loss", "forward: matmuls"]
    assert got["forward: matmuls"] == pytest.approx(1.0)  # 4 ms over 2 steps x 2 devices
    assert list(got.values())[0] == pytest.approx(1.5)
