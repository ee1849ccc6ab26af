"""The model's layout serves torch's model-parallel machinery (2 gloo ranks each).

Not strategies yet: these check that what the pipeline, tensor-parallel and
fully-sharded strategies will build on works with this model as it is laid out,
and matches the unsharded model: `PipelineStage`s cut with `model.stage`, the
Megatron plan applied by name with `parallelize_module` (with and without
sequence parallelism), and `fully_shard` per block.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from shoal.tasks.lm.config import LMModelConfig
from shoal.tasks.lm.model import TransformerLM, build_lm
from shoal.tasks.lm.parallel import tensor_parallel_plan
from tests.comm.group import run_in_group

VOCAB = 65  # not divisible by 2: the vocabulary shards unevenly


def _reference(position: str) -> tuple[TransformerLM, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The full model, a batch, and its loss (mean over tokens) with gradients."""
    config = LMModelConfig(dim=32, heads=4, layers=4, context=16, position=position)
    torch.manual_seed(0)
    model = build_lm(config, VOCAB)
    tokens = torch.randint(0, VOCAB, (4, 17), generator=torch.Generator().manual_seed(1))
    loss = _loss(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    return model, tokens[:, :-1], tokens[:, 1:], loss.detach()


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="sum") / 64


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        out[name] = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad.clone()
    return out


def _assert_same_grads(model: torch.nn.Module, reference: dict[str, torch.Tensor]) -> None:
    grads = _grads(model)
    assert grads, "no parameters"
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference[name], rtol=1e-5, atol=1e-6, msg=name)


def _tensor_parallel(rank: int, world_size: int) -> None:
    mesh = init_device_mesh("cpu", (world_size,))
    shapes: list[torch.Size] = []
    for position, sequence_parallel in (("learned", False), ("rotary", True)):
        reference, inputs, targets, expected = _reference(position)
        model, *_ = _reference(position)  # the same full model, then sharded
        model.zero_grad()
        torch.distributed.tensor.parallel.parallelize_module(
            model, mesh, tensor_parallel_plan(model, sequence_parallel)
        )
        q = model.get_submodule("blocks.0.attn.q").weight
        assert isinstance(q, DTensor) and q.to_local().shape == (16, 32), "2 of 4 heads a rank"
        shapes.clear()
        model.get_submodule("blocks.1").register_forward_hook(
            lambda _m, _i, out: shapes.append(out.shape)
        )
        loss = _loss(model(inputs), targets)
        loss.backward()
        time = 8 if sequence_parallel else 16
        assert shapes == [torch.Size([4, time, 32])], "sequence-sharded between blocks with SP"
        torch.testing.assert_close(loss.detach(), expected, rtol=1e-6, atol=1e-6)
        _assert_same_grads(model, _grads(reference))


def test_megatron_plan_matches_the_unsharded_model(tmp_path: Path) -> None:
    assert run_in_group(2, _tensor_parallel, tmp_path) == [0, 1]


def _pipeline(rank: int, world_size: int) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    reference, inputs, targets, expected = _reference("learned")
    reference_grads = _grads(reference)
    for schedule_class in (ScheduleGPipe, Schedule1F1B):
        reference.zero_grad()
        stage_model = reference.stage(0, 1) if rank == 0 else reference.stage(2, 3)
        stage = PipelineStage(stage_model, rank, world_size, torch.device("cpu"))
        schedule = schedule_class(stage, n_microbatches=2, loss_fn=_loss, scale_grads=False)
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(inputs)
        else:
            schedule.step(target=targets, losses=losses)
            # each micro-batch's loss is its token sum / all 64 tokens: they add up to the loss
            torch.testing.assert_close(sum(losses), expected, rtol=1e-6, atol=1e-6)
        _assert_same_grads(stage_model, reference_grads)


def test_pipeline_stages_match_the_full_model(tmp_path: Path) -> None:
    assert run_in_group(2, _pipeline, tmp_path) == [0, 1]


def _fully_sharded(rank: int, world_size: int) -> None:
    from torch.distributed.fsdp import fully_shard

    reference, inputs, targets, expected = _reference("rotary")
    model, *_ = _reference("rotary")
    model.zero_grad()
    mesh = init_device_mesh("cpu", (world_size,))
    for block in model.blocks.values():
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # each rank takes half the batch; the loss of each half is its token sum / all tokens
    half = slice(rank * 2, rank * 2 + 2)
    loss = _loss(model(inputs[half]), targets[half])
    loss.backward()
    total = loss.detach().clone()
    torch.distributed.all_reduce(total)
    torch.testing.assert_close(total, expected, rtol=1e-6, atol=1e-6)
    # FSDP averages gradients over ranks; the halves' gradients sum to the full batch's
    grads = {name: grad * world_size for name, grad in _grads(model).items()}
    for name, grad in grads.items():
        torch.testing.assert_close(grad, _grads(reference)[name], rtol=1e-5, atol=1e-6, msg=name)


def test_fully_shard_per_block_matches_the_full_model(tmp_path: Path) -> None:
    assert run_in_group(2, _fully_sharded, tmp_path) == [0, 1]
