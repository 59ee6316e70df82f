"""Point-cloud operators of PointNet++-style networks: sampling, grouping, interpolation, voxelisation."""

from __future__ import annotations

import torch

from tailjit.bench.registry import operator


def _cloud_inputs(size, gen):
    batch, points = (8, 1024) if size == "small" else (16, 2048)
    return (torch.rand(batch, points, 3, generator=gen),)


def _fps_jax(xyz):
    import jax
    import jax.numpy as jnp

    batch, n, _ = xyz.shape
    npoint = n // 4
    rows = jnp.arange(batch)

    def step(i, state):
        centroids, distance, farthest = state
        centroids = centroids.at[:, i].set(farthest)
        centroid = xyz[rows, farthest][:, None, :]
        distance = jnp.minimum(distance, ((xyz - centroid) ** 2).sum(-1))
        return centroids, distance, jnp.argmax(distance, axis=-1).astype(jnp.int32)

    init = (
        jnp.zeros((batch, npoint), dtype=jnp.int32),
        jnp.full((batch, n), jnp.inf, dtype=xyz.dtype),
        jnp.zeros(batch, dtype=jnp.int32),
    )
    return jax.lax.fori_loop(0, npoint, step, init)[0]


@operator(
    domain="point-cloud",
    tags=("view", "loop", "inplace", "adv-index", "broadcast", "reduction"),
    reference="farthest point sampling of PointNet++ set abstraction (Qi et al. 2017)",
    inputs=_cloud_inputs,
    jax=_fps_jax,
)
def farthest_point_sampling(xyz):
    """Pick N/4 of the points xyz (B, N, 3), each the farthest from those already picked (starting at 0)."""
    batch, n, _ = xyz.shape
    npoint = n // 4
    centroids = torch.zeros(batch, npoint, dtype=torch.long, device=xyz.device)
    distance = torch.full((batch, n), float("inf"), dtype=xyz.dtype, device=xyz.device)
    farthest = torch.zeros(batch, dtype=torch.long, device=xyz.device)
    batch_idx = torch.arange(batch, device=xyz.device)
    for i in range(npoint):
        centroids[:, i] = farthest
        centroid = xyz[batch_idx, farthest].unsqueeze(1)
        dist = ((xyz - centroid) ** 2).sum(-1)
        distance = torch.minimum(distance, dist)
        farthest = distance.argmax(-1)
    return centroids


_RADIUS, _NSAMPLE = 0.2, 32


def _query_inputs(size, gen):
    batch, points, queries = (8, 1024, 256) if size == "small" else (2, 4096, 512)
    xyz = torch.rand(batch, points, 3, generator=gen)
    return xyz, xyz[:, :queries].clone()


def _ball_query_jax(xyz, new_xyz):
    import jax.numpy as jnp

    batch, n, _ = xyz.shape
    sqrdists = ((new_xyz[:, :, None, :] - xyz[:, None, :, :]) ** 2).sum(-1)
    group_idx = jnp.where(sqrdists > _RADIUS**2, n, jnp.arange(n)[None, None, :])
    group_idx = jnp.sort(group_idx, axis=-1)[:, :, :_NSAMPLE]
    return jnp.where(group_idx == n, group_idx[:, :, :1], group_idx)


@operator(
    domain="point-cloud",
    tags=("view", "broadcast", "reduction", "adv-index", "input-dependent", "inplace"),
    reference="ball query grouping of PointNet++ (Qi et al. 2017)",
    inputs=_query_inputs,
    jax=_ball_query_jax,
)
def ball_query(xyz, new_xyz):
    """Indices (B, S, 32) of the first 32 points within radius 0.2 of each query, padded by the first."""
    batch, n, _ = xyz.shape
    s = new_xyz.size(1)
    sqrdists = ((new_xyz[:, :, None, :] - xyz[:, None, :, :]) ** 2).sum(-1)
    group_idx = torch.arange(n, device=xyz.device).view(1, 1, n).repeat(batch, s, 1)
    group_idx[sqrdists > _RADIUS**2] = n
    group_idx = group_idx.sort(dim=-1).values[:, :, :_NSAMPLE]
    first = group_idx[:, :, :1].expand(-1, -1, _NSAMPLE)
    empty = group_idx == n
    group_idx[empty] = first[empty]
    return group_idx


_KNN = 16


def _knn_inputs(size, gen):
    xyz, new_xyz = _query_inputs(size, gen)
    return xyz, new_xyz, torch.randn(xyz.size(0), xyz.size(1), 32, generator=gen)


def _knn_jax(xyz, new_xyz, feats):
    import jax
    import jax.numpy as jnp

    dists = ((new_xyz[:, :, None, :] - xyz[:, None, :, :]) ** 2).sum(-1)
    idx = jax.lax.top_k(-dists, _KNN)[1]
    rows = jnp.arange(xyz.shape[0])[:, None, None]
    grouped_xyz = xyz[rows, idx] - new_xyz[:, :, None, :]
    return jnp.concatenate((grouped_xyz, feats[rows, idx]), axis=-1)


@operator(
    domain="point-cloud",
    tags=("view", "broadcast", "reduction", "adv-index", "container"),
    reference="kNN grouping of DGCNN / PointNet++ variants (Wang et al. 2019; Qi et al. 2017)",
    inputs=_knn_inputs,
    differentiable=True,
    grad_argnums=(0, 1, 2),
    jax=_knn_jax,
)
def knn_group(xyz, new_xyz, feats):
    """Group the 16 nearest points of each query: relative coordinates and features, (B, S, 16, 3 + C)."""
    dists = ((new_xyz[:, :, None, :] - xyz[:, None, :, :]) ** 2).sum(-1)
    idx = dists.topk(_KNN, dim=-1, largest=False).indices
    batch_idx = torch.arange(xyz.size(0), device=xyz.device)[:, None, None]
    grouped_xyz = xyz[batch_idx, idx] - new_xyz.unsqueeze(2)
    grouped_feats = feats[batch_idx, idx]
    return torch.cat([grouped_xyz, grouped_feats], dim=-1)


def _interp_inputs(size, gen):
    batch, dense, sparse, channels = (8, 1024, 256, 64) if size == "small" else (4, 4096, 512, 64)
    unknown = torch.rand(batch, dense, 3, generator=gen)
    known = torch.rand(batch, sparse, 3, generator=gen)
    return unknown, known, torch.randn(batch, sparse, channels, generator=gen)


def _three_nn_jax(unknown, known, known_feats):
    import jax
    import jax.numpy as jnp

    dists = ((unknown[:, :, None, :] - known[:, None, :, :]) ** 2).sum(-1)
    neg, idx = jax.lax.top_k(-dists, 3)
    weight = 1.0 / (-neg + 1e-8)
    weight = weight / weight.sum(axis=-1, keepdims=True)
    rows = jnp.arange(unknown.shape[0])[:, None, None]
    return (known_feats[rows, idx] * weight[..., None]).sum(axis=2)


@operator(
    domain="point-cloud",
    tags=("view", "broadcast", "reduction", "adv-index"),
    reference="three-NN inverse-distance feature propagation of PointNet++ (Qi et al. 2017)",
    inputs=_interp_inputs,
    differentiable=True,
    grad_argnums=(2,),
    jax=_three_nn_jax,
)
def three_nn_interpolate(unknown, known, known_feats):
    """Features at points unknown (B, N, 3) as the inverse-distance mix of their 3 nearest known points."""
    dists = ((unknown[:, :, None, :] - known[:, None, :, :]) ** 2).sum(-1)
    dist3, idx = dists.topk(3, dim=-1, largest=False)
    weight = 1.0 / (dist3 + 1e-8)
    weight = weight / weight.sum(dim=-1, keepdim=True)
    batch_idx = torch.arange(unknown.size(0), device=unknown.device)[:, None, None]
    neighbours = known_feats[batch_idx, idx]
    return (neighbours * weight.unsqueeze(-1)).sum(dim=2)


_VOXEL = 0.05


def _voxel_inputs(size, gen):
    points, channels = (20_000, 4) if size == "small" else (1_000_000, 4)
    # a few points fall outside the [0, 1)^3 grid and are dropped, as with a range-limited lidar crop
    xyz = torch.rand(points, 3, generator=gen) * 1.1 - 0.05
    return xyz, torch.randn(points, channels, generator=gen)


@operator(
    domain="point-cloud",
    tags=("view", "reduction", "adv-index", "input-dependent", "inplace", "broadcast"),
    reference="point-to-voxel grouping with mean features of VoxelNet / PointPillars (Zhou & Tuzel 2018)",
    inputs=_voxel_inputs,
    differentiable=True,
    grad_argnums=(1,),
)
def voxelize_mean(points, feats):
    """Bin points (N, 3) into 0.05 voxels of [0, 1)^3; returns voxel coords, point->voxel ids, mean feats."""
    grid = round(1 / _VOXEL)
    coords = torch.floor(points / _VOXEL).long()
    inside = ((coords >= 0) & (coords < grid)).all(dim=1)
    coords, feats = coords[inside], feats[inside]
    keys = (coords[:, 0] * grid + coords[:, 1]) * grid + coords[:, 2]
    voxel_keys, inverse = torch.unique(keys, sorted=True, return_inverse=True)
    counts = torch.bincount(inverse, minlength=voxel_keys.numel())
    voxel_feats = feats.new_zeros(voxel_keys.numel(), feats.size(1))
    voxel_feats.index_add_(0, inverse, feats)
    voxel_feats = voxel_feats / counts.unsqueeze(1).to(feats.dtype)
    voxel_coords = torch.stack((voxel_keys // (grid * grid), voxel_keys // grid % grid, voxel_keys % grid), dim=1)
    return voxel_coords, inverse, voxel_feats
