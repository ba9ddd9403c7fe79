"""Which slice of every weight, head and KV head each rank of a tensor-parallel group owns.

Pure arithmetic over the model's shape (no torch), so the rules are unit-tested exhaustively
and a later handoff between groups of different sizes can read the same head ranges.

    rank r of N (Megatron/vLLM split of a gated decoder layer):
      qkv_proj     column-parallel: q heads  [r*nh/N, (r+1)*nh/N)  and their K/V heads
      o_proj       row-parallel:    input columns of those q heads, then all-reduce
      gate_up_proj column-parallel: gate rows [r*I/N, (r+1)*I/N) and the same up rows
      down_proj    row-parallel:    input columns [r*I/N, (r+1)*I/N), then all-reduce
      embed_tokens, lm_head, norms  replicated (every rank holds them whole)
      a MoE layer    every expert's gate_up/down split like the dense MLP's over the expert
                     width (each rank holds every expert's slice), the shared expert over its
                     own width, the router replicated; the block's output all-reduced once
      a MoE layer, expert parallel (vLLM's --enable-expert-parallel): rank r holds whole
                     routed experts [start_r, start_r + n_r) (``expert_span``), the shared
                     expert still split over its width, the router replicated; the block's
                     output all-reduced once

Expert placement is vLLM's "linear" one: contiguous ranges, E // N experts each and one more
on each of the first E % N ranks (8 experts over 3 ranks: [0, 3), [3, 6), [6, 8)). A
contiguous range keeps a rank's routed slots one run of the expert-sorted slots
(tandem/engine/models/layers/moe_experts.py), and a rank with no experts (fewer experts than
ranks) contributes zero. The expert width need not divide: no expert is cut.

Multi-head latent attention (DeepSeek-V2/V3) splits its query heads the same way (q_proj or
q_b_proj and kv_b_proj by head rows, o_proj by their input columns, then all-reduce), while the
compressed latent (kv_a_proj_with_mqa, kv_a_layernorm, q_a_proj, q_a_layernorm) stays whole:
its cache is one latent "head" every query head reads, so every rank holds all of it (the
plan's one KV head, replicated on every rank: tandem/engine/parallel/shard_mla.py).

KV heads split when the group divides them (rank r holds K/V heads [r*nkv/N, (r+1)*nkv/N));
with fewer KV heads than ranks each KV head is replicated on N/nkv consecutive ranks (rank r
holds head r // (N/nkv)), as vLLM does. Each rank's paged KV cache holds exactly its
``kv_heads`` (``ShardPlan.kv_head_ranges``): the per-rank layout a handoff between groups
re-shards by.

Block-quantized weights (GGUF's 32-value blocks, int4 groups, a pre-quantized checkpoint's
groups) are split only on group boundaries: a row-parallel split must fall on a multiple of
``group``. Any size that does not divide is refused with a ``TensorParallelError`` naming the
numbers.
"""

from __future__ import annotations

from dataclasses import dataclass


class TensorParallelError(ValueError):
    """A model cannot be split over the asked group size (the message names the numbers)."""


@dataclass(frozen=True, slots=True)
class Span:
    """The half-open index range ``[start, stop)``."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        """How many indices the range holds."""
        return self.stop - self.start

    def scaled(self, k: int, offset: int = 0) -> Span:
        """``[offset + start*k, offset + stop*k)``: heads to rows (``k`` = head_dim)."""
        return Span(offset + self.start * k, offset + self.stop * k)


@dataclass(frozen=True, slots=True)
class RankShard:
    """What rank ``rank`` of ``world`` owns of one decoder layer (every layer alike)."""

    rank: int
    world: int
    head_dim: int
    num_heads: int  # the model's, to place the K and V rows after the Q rows
    num_kv_heads: int
    intermediate_size: int
    q_heads: Span
    kv_heads: Span
    intermediate: Span
    # expert parallel: the routed experts this rank holds whole (None: every expert, each
    # split over the expert width)
    experts: Span | None = None

    @property
    def kv_replicas(self) -> int:
        """How many ranks hold each of this rank's KV heads (1: KV heads are split)."""
        return max(1, self.world // self.num_kv_heads)

    def qkv_rows(self) -> list[Span]:
        """Output rows of the fused ``qkv_proj`` this rank keeps: its Q, K and V rows."""
        hd, nh, nkv = self.head_dim, self.num_heads, self.num_kv_heads
        return [self.q_heads.scaled(hd), self.kv_heads.scaled(hd, nh * hd),
                self.kv_heads.scaled(hd, (nh + nkv) * hd)]

    def o_cols(self) -> Span:
        """Input columns of ``o_proj`` this rank keeps (its q heads' outputs)."""
        return self.q_heads.scaled(self.head_dim)

    def split(self, width: int) -> Span:
        """This rank's even share of ``width`` (an MLP's intermediate width)."""
        return _even(width, self.world, self.rank)

    def gate_up_rows(self, width: int | None = None) -> list[Span]:
        """Output rows of a fused ``gate_up_proj`` of intermediate ``width`` (None: the dense
        MLP's) this rank keeps: its gate and up rows."""
        width = self.intermediate_size if width is None else width
        i = self.split(width)
        return [i, Span(width + i.start, width + i.stop)]

    def down_cols(self, width: int | None = None) -> Span:
        """Input columns of a ``down_proj`` of intermediate ``width`` (None: the dense
        MLP's) this rank keeps."""
        return self.split(self.intermediate_size if width is None else width)

    @property
    def adds_bias(self) -> bool:
        """Whether this rank adds a row-parallel layer's bias (rank 0 only: the all-reduce
        sums the partial products, so the bias must enter once)."""
        return self.rank == 0


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """The split of one model over a group of ``world`` ranks (validated by ``plan_shards``)."""

    world: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    group: int | None  # quantization group every row-parallel split falls on (None: any)
    num_experts: int = 0  # routed experts per MoE layer (0: a dense model)
    expert_parallel: bool = False  # routed experts placed whole (``expert_span``)

    def rank(self, r: int) -> RankShard:
        """Rank ``r``'s shard."""
        if not 0 <= r < self.world:
            raise TensorParallelError(f"rank {r} is outside a group of {self.world}")
        w = self.world
        q = _even(self.num_heads, w, r)
        if self.num_kv_heads >= w:
            kv = _even(self.num_kv_heads, w, r)
        else:  # replicated: N / nkv consecutive ranks share each KV head
            head = r // (w // self.num_kv_heads)
            kv = Span(head, head + 1)
        experts = (expert_span(self.num_experts, w, r)
                   if self.expert_parallel and self.num_experts else None)
        return RankShard(r, w, self.head_dim, self.num_heads, self.num_kv_heads,
                         self.intermediate_size, q, kv, _even(self.intermediate_size, w, r),
                         experts)

    def kv_head_ranges(self) -> list[Span]:
        """Each rank's KV heads, by rank: the layout of the group's KV cache."""
        return [self.rank(r).kv_heads for r in range(self.world)]


def expert_span(num_experts: int, world: int, r: int) -> Span:
    """The routed experts rank ``r`` of ``world`` holds under expert parallelism: a
    contiguous range, ``num_experts // world`` long plus one on the first
    ``num_experts % world`` ranks (vLLM's linear placement); empty when there are fewer
    experts than ranks and ``r`` is past them."""
    per, extra = divmod(num_experts, world)
    start = r * per + min(r, extra)
    return Span(start, start + per + int(r < extra))


def _even(n: int, world: int, r: int) -> Span:
    per = n // world
    return Span(r * per, (r + 1) * per)


def plan_shards(
    world: int,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_size: int,
    group: int | None = None,
    expert_intermediate_size: int | None = None,
    shared_intermediate_size: int = 0,
    mla: bool = False,
    num_experts: int = 0,
    expert_parallel: bool = False,
) -> ShardPlan:
    """The split of a model of this shape over ``world`` ranks; TensorParallelError when a
    size does not divide (or a row-parallel split would cut a quantization group of
    ``group`` values). ``mla``: multi-head latent attention, whose cache is one latent head
    (``num_kv_heads`` is taken as 1: every rank holds it whole) and whose ``head_dim`` is
    o_proj's input per head (v_head_dim). A mixture-of-experts model gives its routed experts' width
    (``expert_intermediate_size``) and its shared expert's (0: none): both split as the
    dense MLP's ``intermediate_size`` does. ``expert_parallel`` (with ``num_experts`` routed
    experts a layer): each rank holds whole experts instead (``expert_span``), so the
    expert width need not divide; the shared expert still splits over its width."""
    if world < 1:
        raise TensorParallelError(f"--tensor-parallel-size must be >= 1, got {world}")
    if mla:
        num_kv_heads = 1  # the latent, replicated on every rank
    expert_parallel = expert_parallel and num_experts > 0  # a dense model: nothing to place
    if world == 1:
        return ShardPlan(1, num_heads, num_kv_heads, head_dim, intermediate_size, group,
                         num_experts, expert_parallel)
    if num_heads % world:
        raise TensorParallelError(
            f"{num_heads} attention heads do not divide over --tensor-parallel-size {world}")
    if num_kv_heads % world and world % num_kv_heads:
        raise TensorParallelError(
            f"{num_kv_heads} KV heads neither divide over --tensor-parallel-size {world} nor "
            f"replicate evenly ({world} is not a multiple of {num_kv_heads})")
    mlps = [("the MLP's intermediate size", intermediate_size)]
    if expert_intermediate_size is not None and not expert_parallel:
        mlps.append(("an expert's intermediate size", expert_intermediate_size))
    if shared_intermediate_size:
        mlps.append(("the shared expert's intermediate size", shared_intermediate_size))
    for what, width in mlps:
        if width % world:
            raise TensorParallelError(
                f"{what} {width} does not divide over --tensor-parallel-size {world}")
    if group is not None:
        inputs = [("o_proj's input (heads x head_dim)", num_heads // world * head_dim)]
        inputs += [(f"down_proj's input ({what})", width // world) for what, width in mlps]
        for what, width in inputs:
            if width % group:
                raise TensorParallelError(
                    f"{what} splits into {width} columns per rank over "
                    f"--tensor-parallel-size {world}, not a multiple of the quantization "
                    f"group of {group}")
    return ShardPlan(world, num_heads, num_kv_heads, head_dim, intermediate_size, group,
                     num_experts, expert_parallel)
