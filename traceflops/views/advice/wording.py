"""Remedy and record texts that are no single rule's own: the JAX wordings, per-dimension communication remedies,
convolution remedies, and what to record next time, by framework.

Kept apart so the texts shared by rules and entries are in one place, and the framework switch (`say`, `to_record`)
is next to them.
"""

from __future__ import annotations

from traceflops.views.advice.context import Ctx, is_jax

# What to try in a JAX program (an XLA profile), where the PyTorch remedies name the wrong tools.
JAX_REMEDIES = {
    "host_bound": [
        "Put the whole step (model, loss, jax.grad and the optax update) under one jax.jit: one program dispatch per "
        "step",
        (
            "Keep the host ahead: no jax.device_get / float(x) / printing arrays inside the loop, and prefetch the "
            "next "
            "batch to the device (jax.device_put) while this step runs"
        ),
        "A larger batch per step: the same dispatch, more work",
    ],
    "memory_bound": [
        (
            "Keep the step in one jit so XLA fuses the elementwise ops; host callbacks (jax.debug.print, "
            "pure_callback) and "
            "jit boundaries split fusions: check the optimized HLO (XLA_FLAGS=--xla_dump_to=DIR) for unfused ops"
        ),
        "Apply the optax update inside the same jit as the gradient, so its elementwise chain fuses",
    ],
    "fp32_matmul": [
        (
            "Compute in bfloat16: flax modules with dtype=jnp.bfloat16 (param_dtype float32), or cast activations; "
            "jax.default_matmul_precision('bfloat16') (or 'tensorfloat32' on GPUs) for matmuls left in float32"
        ),
    ],
    "communication": [
        (
            "Let XLA overlap collectives with compute: shard with jax.sharding (NamedSharding, PartitionSpec) inside "
            "one jit; "
            "on GPUs XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true"
        ),
        (
            "Move less: shard parameters and optimizer state (FSDP-style PartitionSpecs), accumulate gradients over "
            "micro-batches before reducing them"
        ),
    ],
    "recompute": [
        (
            "Rematerialize selectively: "
            "jax.checkpoint(policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable) "
            "(or checkpoint_dots, or save_only_these_names with jax.ad_checkpoint.checkpoint_name) saves the matmul "
            "outputs and recomputes only cheap ops; flax: nn.remat(Block, policy=...)"
        ),
        "Remat fewer blocks (every other layer) where memory allows",
    ],
    "sync": [
        (
            "Drop host reads inside the step (float(loss), jax.device_get, printing arrays): log every N steps; "
            "block_until_ready only where you time"
        ),
    ],
}


DIMENSION_REMEDIES = {
    "tp": (
        "TP: keep the tensor-parallel group inside one node (NVLink), and overlap its all-gather and reduce-scatter "
        "with "
        "the GEMMs that use them (sequence parallelism with async TP: torch._inductor.config._micro_pipeline_tp, or "
        "Transformer Engine's comm-GEMM overlap); a smaller TP degree trades it for DP or PP"
    ),
    "pp": (
        "PP: receives with nothing to run are the pipeline bubble; more micro-batches per step or an interleaved "
        "schedule (virtual stages) shrink it, see the job's pipeline section"
    ),
    "ep": (
        "EP: overlap the token all-to-all with the shared expert's or the next micro-batch's compute, and balance the "
        "tokens per expert (an imbalanced all-to-all waits for the busiest rank)"
    ),
    "cp": "CP: overlap the ring's key/value exchange with the attention of the block already received",
}


PASS_WORDS = {
    "fwd": "forward",
    "dgrad": "input gradient",
    "wgrad": "weight gradient",
    "dgrad+wgrad": "input and weight gradients",
    "bwd": "backward",
}


# Fusing what surrounds the convolutions (a CNN's non-matmul time is BatchNorm, ReLU and residual adds).
CONV_FUSE = (
    "Fuse BatchNorm + ReLU (+ the residual add) around the convolutions: torch.compile the model (Inductor fuses them, "
    "with channels_last); for inference fold BatchNorm into the convolution weights "
    "(torch.ao.quantization.fuse_modules)"
)


CONV_REMEDIES = [
    (
        'Mixed precision first: torch.autocast(device_type="cuda", dtype=torch.float16 or torch.bfloat16) runs the '
        "convolutions "
        "on tensor cores; TF32 for what stays fp32 (torch.backends.cudnn.allow_tf32, Ampere and later)"
    ),
    (
        "channels_last: model.to(memory_format=torch.channels_last) and the same for its inputs: cuDNN's tensor-core "
        "convolution "
        "kernels are NHWC, so NCHW pays layout transposes"
    ),
    "torch.backends.cudnn.benchmark = True with fixed input sizes: cuDNN times its algorithms once and keeps the "
    "fastest",
    (
        "Channel counts in multiples of 8 (fp16/bf16; 4 for TF32) so the convolutions run on tensor cores, 64 or more "
        "to fill "
        "their tiles: pad the stem's 3 input channels to 4 or 8"
    ),
    CONV_FUSE,
]


CONV_REMEDIES_JAX = [
    "Compute in bfloat16: flax nn.Conv(..., dtype=jnp.bfloat16) (param_dtype float32), or cast the activations",
    (
        "NHWC convolutions (flax's default; dimension_numbers=('NHWC', 'HWIO', 'NHWC') in lax.conv_general_dilated) "
        "with "
        "feature counts in multiples of 128 on TPUs (8 on GPUs)"
    ),
    "A larger batch per device: the late layers' small spatial sizes cannot fill the matrix units",
]


RECORD = {  # what to record next time, by framework
    "shapes": (
        "profile with record_shapes=True: the ops' input shapes give FLOPs and GEMM shapes",
        (
            "FLOPs and shapes come from the HLO in the profile: capture it with jax.profiler.trace around jitted "
            "steps of this process, so the profile holds the programs' HLO modules"
        ),
    ),
    "stack": (
        (
            "profile with with_stack=True (and a schedule over several steps after warm-up): the Python stack "
            "shows what the host ran over the gaps"
        ),
        (
            "profile with jax.profiler.trace over several steps after warm-up, with the Python tracer on "
            "(jax.profiler.ProfileOptions: python_tracer_level=1, host_tracer_level=2): it shows what the host ran "
            "over the gaps"
        ),
    ),
    "device": (
        (
            "profile on the accelerator with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]: the "
            "kernels, their launches and the idle gaps between them are then in the trace"
        ),
        (
            "profile on the accelerator (jax.profiler.trace on a GPU or TPU backend): the device's ops and the "
            "idle gaps between them are then in the profile"
        ),
    ),
    "hardware": (
        (
            "name the device (--hardware NAME) instead of a bare --peak-tflops: the roofline, tensor-core "
            "dtypes and wave quantization need its bandwidth and SM count"
        ),
    )
    * 2,
}


def to_record(ctx: Ctx, *what: str) -> list[str]:
    """What to record next time, worded for the trace's framework."""
    return [RECORD[w][1 if is_jax(ctx) else 0] for w in what]


def say(ctx: Ctx, pytorch: list[str], jax: list[str]) -> list[str]:
    return jax if is_jax(ctx) else pytorch
