"""Where a step's time goes: XLA operations sorted into kinds of work by the JAX
operation that made them."""

import collections

import jax
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


FWD = "jit(step_fn)/shard_map/jvp(Transformer)/layers_0/attn"
BWD = "jit(step_fn)/shard_map/transpose(jvp(Transformer))/layers_1/attn"
# At one head XLA rewrites the attention's batched products without the head axis and
# leaves the new ones (and some reductions) without an op_name.
RENAMED = f"""
HloModule jit_step_fn, entry_computation_layout={{(f32[2,4,8]{{2,1,0}})->f32[2,4]{{1,0}}}}

%fused_computation.45 (param_0.55: f32[2,4,8], param_1.57: f32[2,4,8]) -> f32[2,4,4] {{
  %param_0.55 = f32[2,4,8]{{2,1,0}} parameter(0)
  %param_1.57 = f32[2,4,8]{{2,1,0}} parameter(1)
  ROOT %dot.114 = f32[2,4,4]{{2,1,0}} dot(%param_0.55, %param_1.57), lhs_batch_dims={{0}}
}}

%fused_computation.53 (param_0.66: f32[], param_1.70: f32[2,4,8]) -> f32[2,4] {{
  %param_1.70 = f32[2,4,8]{{2,1,0}} parameter(1)
  %param_0.66 = f32[] parameter(0)
  ROOT %reduce.6 = f32[2,4]{{1,0}} reduce(%param_1.70, %param_0.66), to_apply=%add.1
}}

%fused_computation.60 (param_0.1: f32[2,4,8]) -> f32[2,4,8] {{
  %param_0.1 = f32[2,4,8]{{2,1,0}} parameter(0)
  ROOT %negate.1 = f32[2,4,8]{{2,1,0}} negate(%param_0.1)
}}

ENTRY %main.1_spmd (param.1: f32[2,4,8]) -> (f32[2,4,4], f32[2,4]) {{
  %param.1 = f32[2,4,8]{{2,1,0}} parameter(0)
  %constant.1 = f32[] constant(0)
  %fwd = f32[2,4,8]{{2,1,0}} fusion(%param.1), kind=kLoop, calls=%fused_computation.60, \
metadata={{op_name="{FWD}/mul" stack_frame_id=1}}
  %bwd = f32[2,4,8]{{2,1,0}} fusion(%fwd), kind=kLoop, calls=%fused_computation.60, \
metadata={{op_name="{BWD}/div"}}
  %copy.3 = f32[2,4,8]{{2,1,0}} copy(%bwd)
  %negate.2 = f32[2,4,8]{{2,1,0}} fusion(%fwd), kind=kLoop, calls=%fused_computation.60
  %ynn_fusion.45 = f32[2,4,4]{{2,1,0}} fusion(%fwd, %param.1), kind=kCustom, \
calls=%fused_computation.45, backend_config={{"fusion_config":{{"kind":"__ynn_fusion"}}}}
  %dot.62 = f32[2,8,8]{{2,1,0}} dot(%fwd, %copy.3), lhs_batch_dims={{0}}
  %ynn_fusion.53 = f32[2,4]{{1,0}} fusion(%constant.1, %copy.3), kind=kCustom, \
calls=%fused_computation.53
  %dot.70 = f32[2,8,8]{{2,1,0}} dot(%param.1, %param.1), lhs_batch_dims={{0}}
  %dot.71 = f32[2,8,8]{{2,1,0}} dot(%fwd, %param.1), metadata={{op_name="{FWD}/einsum"}}
  ROOT %tuple.1 = (f32[2,4,4]{{2,1,0}}, /*index=1*/f32[2,4]{{1,0}}) \
tuple(%ynn_fusion.45, %ynn_fusion.53)
}}
""".replace("\\\n", "")


def test_unnamed_products_and_reductions_take_the_path_of_what_they_read():
    names = step_profile.op_names(RENAMED)
    # A fused product of forward values is forward work of their module.
    assert names["ynn_fusion.45"] == f"{FWD}/dot_general"
    # Backward as soon as one operand is, even through an unnamed copy.
    assert names["dot.62"] == f"{BWD}/dot_general"
    assert names["ynn_fusion.53"] == f"{BWD}/reduce"
    assert step_profile.category("dot.62", names["dot.62"]) == "backward: matmuls"
    kind = step_profile.category("ynn_fusion.53", names["ynn_fusion.53"])
    assert kind == "backward: attention softmax, mask and dropout"
    # Neither a product nor a reduction, or reading nothing named: left unnamed.
    assert names["copy.3"] is None and names["negate.2"] is None and names["dot.70"] is None
    # A named operation keeps its own name, product or not.
    assert names["dot.71"] == f"{FWD}/einsum" and names["bwd"] == f"{BWD}/div"
    assert names["tuple.1"] is None


def test_a_backward_operand_wins_over_forward_ones_in_any_order():
    text = RENAMED.replace("dot(%fwd, %copy.3)", "dot(%copy.3, %fwd)")
    assert step_profile.op_names(text)["dot.62"] == f"{BWD}/dot_general"
    forward_only = RENAMED.replace("dot(%fwd, %copy.3)", "dot(%fwd, %fwd)")
    assert step_profile.op_names(forward_only)["dot.62"] == f"{FWD}/dot_general"


def test_the_one_head_step_leaves_no_product_or_reduction_unnamed():
    """The compiled 1-head training step: XLA drops the names of its attention products
    (two per layer forward, four backward) and of the softmax backward's row term, which
    then count by what they read, not as unnamed work. (Two small layers: the renaming
    is per layer and does not depend on the width.)"""
    from beyondpar import model, tasks
    from beyondpar.base import parallel
    from beyondpar.benchmarks import train as train_benchmark

    examples = tasks.make_examples("copy", jax.random.PRNGKey(1), 8, 16, 32)
    cfg = model.ModelConfig(
        num_heads=1, num_layers=2, embed_dim=16, mlp_dim=32, vocab_size=32, max_len=16
    )
    text = train_benchmark._jax_step(cfg, parallel.data_mesh(), examples)[1]()
    instructions, work = step_profile._parse(text)
    entry = text[text.index("\nENTRY") :]
    top_level = [name for name in work if f"%{name} = " in entry]
    dropped = [name for name in top_level if instructions[name].op_name is None]
    assert dropped, "XLA now names every product: this renaming may no longer be needed"
    names = step_profile.op_names(text)
    assert [name for name in top_level if names[name] is None] == []
    kinds = collections.Counter(step_profile.category(n, names[n]) for n in dropped)
    layers = cfg.num_layers
    assert kinds == {
        "forward: matmuls": 2 * layers,
        "backward: matmuls": 4 * layers,
        "backward: attention softmax, mask and dropout": layers,
    }
    assert all("/attn/" in names[name] for name in dropped)


FUSED = f"""
HloModule jit_step_fn

%fused_computation.7 (param_0.2: f32[2,4,8], param_1.3: f32[2,4,8]) -> f32[2,4] {{
  %param_0.2 = f32[2,4,8]{{2,1,0}} parameter(0)
  %param_1.3 = f32[2,4,8]{{2,1,0}} parameter(1)
  %dot.5 = f32[2,4,4]{{2,1,0}} dot(%param_0.2, %param_1.3), lhs_batch_dims={{0}}
  %constant.4 = f32[] constant(0)
  ROOT %reduce.9 = f32[2,4]{{1,0}} reduce(%dot.5, %constant.4), to_apply=%add.2
}}

%fused_computation.8 (param_0.4: f32[2,4,8]) -> (f32[2,4], f32[2,4]) {{
  %param_0.4 = f32[2,4,8]{{2,1,0}} parameter(0)
  %constant.5 = f32[] constant(0)
  %reduce.10 = f32[2,4]{{1,0}} reduce(%param_0.4, %constant.5), to_apply=%add.2
  ROOT %tuple.3 = (f32[2,4]{{1,0}}, f32[2,4]{{1,0}}) tuple(%reduce.10, %reduce.10)
}}

ENTRY %main.2 (param.1: f32[2,4,8]) -> f32[2,4] {{
  %param.1 = f32[2,4,8]{{2,1,0}} parameter(0)
  %fwd = f32[2,4,8]{{2,1,0}} negate(%param.1), metadata={{op_name="{FWD}/mul"}}
  %bwd = f32[2,4,8]{{2,1,0}} negate(%fwd), metadata={{op_name="{BWD}/div"}}
  %product_fusion = f32[2,4]{{1,0}} fusion(%fwd, %fwd), kind=kOutput, calls=%fused_computation.7
  %dot.8 = f32[2,4,4]{{2,1,0}} dot(%fwd, %param.1), lhs_batch_dims={{0}}, \
control-predecessors={{%bwd}}
  %sums = (f32[2,4]{{1,0}}, f32[2,4]{{1,0}}) fusion(%bwd), kind=kInput, calls=%fused_computation.8
  ROOT %get-tuple-element.1 = f32[2,4]{{1,0}} get-tuple-element(%sums), index=0
}}
""".replace("\\\n", "")


def test_a_fused_product_followed_by_a_reduction_counts_as_a_product():
    names = step_profile.op_names(FUSED)
    assert names["product_fusion"] == f"{FWD}/dot_general"
    assert step_profile.category("product_fusion", names["product_fusion"]) == "forward: matmuls"


def test_only_operands_name_an_unnamed_product_not_its_control_predecessors():
    assert step_profile._instruction(
        "f32[2] dot(%a, %b.1), control-predecessors={%c}"
    ).operands == ("a", "b.1")
    assert step_profile.op_names(FUSED)["dot.8"] == f"{FWD}/dot_general"


def test_a_tuple_shaped_fusion_reads_its_operands():
    text = "(f32[2]{0}, /*index=1*/f32[2]{0}) fusion(%bwd, %x.2), kind=kInput, calls=%f.8"
    assert step_profile._shape_end(text) == text.index(" fusion(")
    instruction = step_profile._instruction(text)
    assert (instruction.opcode, instruction.operands, instruction.calls) == (
        "fusion",
        ("bwd", "x.2"),
        "f.8",
    )
    assert step_profile.op_names(FUSED)["sums"] == f"{BWD}/reduce"


def test_instructions_before_any_computation_header_call_nothing():
    fragment = f"""
  %fwd = f32[2,4,8]{{2,1,0}} fusion(%p), kind=kLoop, metadata={{op_name="{FWD}/mul"}}
  %copy.1 = f32[2,4,8]{{2,1,0}} copy(%fwd)
  %dot.1 = f32[2,8,8]{{2,1,0}} dot(%p, %p), lhs_batch_dims={{0}}
"""
    names = step_profile.op_names(fragment)
    assert names["copy.1"] is None and names["dot.1"] is None


@pytest.mark.parametrize("last", ["reduce_precision", "reduce_min", "reduce_and"])
def test_only_sums_maxima_and_inferred_reductions_are_softmax_work(last):
    assert step_profile.category("f.1", f"{BWD}/reduce").startswith("backward: attention")
    kind = step_profile.category("f.2", f"{BWD}/{last}")
    assert kind == "backward: norms, activations, biases, residuals, loss"
