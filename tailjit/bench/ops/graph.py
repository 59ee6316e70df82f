"""Graph operators of message-passing GNNs: segment reductions, GCN normalisation, GAT edge softmax."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tailjit.bench.registry import operator


def _segment_inputs(size, gen):
    """Rows (E, D) with sorted segment ids; some segments are empty, as in a batch of graphs or nodes."""
    rows, segments, dim = (2000, 100, 32) if size == "small" else (200_000, 5000, 32)
    segment_ids = torch.randint(0, segments, (rows,), generator=gen).sort().values
    return torch.randn(rows, dim, generator=gen), segment_ids


@operator(
    domain="graph",
    tags=("view", "input-dependent", "adv-index", "inplace"),
    reference="sorted segment sum (tf.math.segment_sum; graph readout in PyG global_add_pool)",
    inputs=_segment_inputs,
    differentiable=True,
    grad_argnums=(0,),
)
def segment_sum(data, segment_ids):
    """Sum the rows of data (E, D) per sorted segment id; the last id fixes the number of segments."""
    num_segments = segment_ids[-1].item() + 1
    out = data.new_zeros(num_segments, data.size(1))
    return out.index_add_(0, segment_ids, data)


@operator(
    domain="graph",
    tags=("view", "input-dependent", "loop", "reduction", "inplace", "adv-index"),
    reference="sorted segment mean (tf.math.segment_mean; PyG global_mean_pool)",
    inputs=_segment_inputs,
    differentiable=True,
    grad_argnums=(0,),
)
def segment_mean(data, segment_ids):
    """Average the rows of data (E, D) per sorted segment id, one run of ids at a time; empty ones stay 0."""
    ids, counts = torch.unique_consecutive(segment_ids, return_counts=True)
    out = data.new_zeros(segment_ids[-1].item() + 1, data.size(1))
    for seg, chunk in zip(ids.tolist(), data.split(counts.tolist())):
        out[seg] = chunk.mean(dim=0)
    return out


@operator(
    domain="graph",
    tags=("view", "input-dependent", "reduction", "broadcast", "adv-index"),
    reference="sorted segment max (tf.math.segment_max; PyG global_max_pool)",
    inputs=_segment_inputs,
    differentiable=True,
    grad_argnums=(0,),
)
def segment_max(data, segment_ids):
    """Column-wise maximum of the rows of data (E, D) per segment id; empty segments give 0."""
    num_segments = segment_ids.max().item() + 1
    index = segment_ids.unsqueeze(1).expand_as(data)
    out = data.new_zeros(num_segments, data.size(1))
    return out.scatter_reduce(0, index, data, reduce="amax", include_self=False)


def _graph_inputs(size, gen):
    """Node features (N, D) and a random directed edge list (2, E) without self loops."""
    nodes, edges, dim = (1000, 10_000, 64) if size == "small" else (50_000, 500_000, 32)
    src = torch.randint(0, nodes, (edges,), generator=gen)
    dst = (src + torch.randint(1, nodes, (edges,), generator=gen)) % nodes
    return torch.randn(nodes, dim, generator=gen), torch.stack((src, dst))


def _gcn_jax(x, edge_index):
    import jax
    import jax.numpy as jnp

    num_nodes = x.shape[0]
    loops = jnp.arange(num_nodes, dtype=edge_index.dtype)
    src = jnp.concatenate((edge_index[0], loops))
    dst = jnp.concatenate((edge_index[1], loops))
    deg = jax.ops.segment_sum(jnp.ones_like(dst, dtype=x.dtype), dst, num_segments=num_nodes)
    deg_inv_sqrt = jnp.where(deg > 0, deg**-0.5, 0.0)
    norm = deg_inv_sqrt[src] * deg_inv_sqrt[dst]
    return jax.ops.segment_sum(x[src] * norm[:, None], dst, num_segments=num_nodes)


@operator(
    domain="graph",
    tags=("view", "adv-index", "inplace", "input-dependent", "broadcast"),
    reference="GCN propagation D^-1/2 (A + I) D^-1/2 X (Kipf & Welling 2017)",
    inputs=_graph_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_gcn_jax,
)
def gcn_propagate(x, edge_index):
    """Add self loops, weight each edge by 1/sqrt(deg(src) deg(dst)) and sum messages at the destinations."""
    num_nodes = x.size(0)
    loops = torch.arange(num_nodes, device=x.device)
    src = torch.cat((edge_index[0], loops))
    dst = torch.cat((edge_index[1], loops))
    deg = torch.zeros(num_nodes, dtype=x.dtype, device=x.device)
    deg.scatter_add_(0, dst, torch.ones_like(dst, dtype=x.dtype))
    deg_inv_sqrt = deg.pow(-0.5)
    deg_inv_sqrt[deg_inv_sqrt == float("inf")] = 0.0
    norm = deg_inv_sqrt[src] * deg_inv_sqrt[dst]
    out = torch.zeros_like(x)
    out.index_add_(0, dst, x[src] * norm.unsqueeze(1))
    return out


def _gat_inputs(size, gen):
    x, edge_index = _graph_inputs(size, gen)
    dim = x.size(1)
    att_src = torch.randn(dim, generator=gen) / dim**0.5
    return x, edge_index, att_src, torch.randn(dim, generator=gen) / dim**0.5


def _gat_jax(x, edge_index, att_src, att_dst):
    import jax
    import jax.numpy as jnp

    src, dst = edge_index[0], edge_index[1]
    num_nodes = x.shape[0]
    logits = jax.nn.leaky_relu((x @ att_src)[src] + (x @ att_dst)[dst], 0.2)
    node_max = jax.ops.segment_max(logits, dst, num_segments=num_nodes)
    exp = jnp.exp(logits - node_max[dst])
    alpha = exp / jax.ops.segment_sum(exp, dst, num_segments=num_nodes)[dst]
    return jax.ops.segment_sum(alpha[:, None] * x[src], dst, num_segments=num_nodes), alpha


@operator(
    domain="graph",
    tags=("view", "reduction", "adv-index", "inplace", "broadcast"),
    reference="graph attention: softmax of edge scores per destination node (Velickovic et al. 2018, GAT)",
    inputs=_gat_inputs,
    differentiable=True,
    grad_argnums=(0, 2, 3),
    jax=_gat_jax,
)
def gat_edge_softmax(x, edge_index, att_src, att_dst):
    """Single-head GAT aggregation: edge softmax over each node's incoming edges; returns (out, alpha)."""
    src, dst = edge_index[0], edge_index[1]
    num_nodes = x.size(0)
    logits = F.leaky_relu((x * att_src).sum(-1)[src] + (x * att_dst).sum(-1)[dst], 0.2)
    node_max = torch.full((num_nodes,), float("-inf"), dtype=x.dtype, device=x.device)
    node_max = node_max.scatter_reduce(0, dst, logits, reduce="amax")
    exp = torch.exp(logits - node_max[dst])
    denom = torch.zeros(num_nodes, dtype=x.dtype, device=x.device).index_add(0, dst, exp)
    alpha = exp / denom[dst]
    out = torch.zeros_like(x)
    out.index_add_(0, dst, alpha.unsqueeze(1) * x[src])
    return out, alpha


def _sage_jax(x, edge_index):
    import jax
    import jax.numpy as jnp

    src, dst = edge_index[0], edge_index[1]
    num_nodes = x.shape[0]
    summed = jax.ops.segment_sum(x[src], dst, num_segments=num_nodes)
    count = jax.ops.segment_sum(jnp.ones_like(dst), dst, num_segments=num_nodes)
    return summed / jnp.maximum(count, 1)[:, None].astype(x.dtype)


@operator(
    domain="graph",
    tags=("view", "broadcast", "adv-index", "inplace"),
    reference="scatter mean (torch_scatter) as the GraphSAGE mean aggregator (Hamilton et al. 2017)",
    inputs=_graph_inputs,
    differentiable=True,
    grad_argnums=(0,),
    jax=_sage_jax,
)
def scatter_mean_aggregate(x, edge_index):
    """Mean of the source features over each node's incoming edges; nodes without edges get 0."""
    src, dst = edge_index[0], edge_index[1]
    index = dst.unsqueeze(1).expand(-1, x.size(1))
    summed = torch.zeros_like(x).scatter_add_(0, index, x[src])
    count = torch.zeros(x.size(0), dtype=x.dtype, device=x.device)
    count.scatter_add_(0, dst, torch.ones_like(dst, dtype=x.dtype))
    return summed / count.clamp(min=1).unsqueeze(1)
