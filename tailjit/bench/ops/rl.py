"""Reinforcement-learning return estimators, targets and losses.

Rollouts are time-major, ``(T, B)``.  The estimators are written the way RL code bases write
them: reverse Python loops over time carrying a running value, indexed in-place writes, lists
stacked at the end; each has a ``jax.lax.scan`` (or vectorised) twin.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tailjit.bench.registry import operator

# ----------------------------------------------------------------------------------------------
# Input generators
# ----------------------------------------------------------------------------------------------


def _rollout(size, gen):
    """A batch of environment rollouts: rewards, value estimates, episode ends and bootstrap values."""
    t, b = (128, 16) if size == "small" else (1000, 8192)
    rewards = torch.randn(t, b, generator=gen)
    values = torch.randn(t, b, generator=gen)
    dones = (torch.rand(t, b, generator=gen) < 0.02).float()
    last_value = torch.randn(b, generator=gen)
    return rewards, values, dones, last_value


def _returns_inputs(size, gen):
    rewards, _, dones, last_value = _rollout(size, gen)
    return rewards, dones, last_value


def _vtrace_inputs(size, gen):
    """Behaviour / target log-probabilities of the taken actions, plus the rollout (IMPALA learner)."""
    t, b = (80, 32) if size == "small" else (100, 32_768)
    behaviour_logp = torch.log(torch.rand(t, b, generator=gen) * 0.9 + 0.05)
    target_logp = behaviour_logp + 0.3 * torch.randn(t, b, generator=gen)
    rewards = torch.randn(t, b, generator=gen)
    values = torch.randn(t, b, generator=gen)
    bootstrap_value = torch.randn(b, generator=gen)
    discounts = 0.99 * (torch.rand(t, b, generator=gen) > 0.02).float()
    return behaviour_logp, target_logp, rewards, values, bootstrap_value, discounts


def _ppo_inputs(size, gen):
    """One PPO minibatch: current logits and values, and the rollout's log-probs, values and returns."""
    n, a = (2048, 18) if size == "small" else (262_144, 18)
    logits = torch.randn(n, a, generator=gen)
    old_logits = logits + 0.2 * torch.randn(n, a, generator=gen)
    actions = torch.multinomial(old_logits.softmax(-1), 1, generator=gen).squeeze(1)
    old_logp = old_logits.log_softmax(-1).gather(1, actions[:, None]).squeeze(1)
    advantages = torch.randn(n, generator=gen)
    returns = torch.randn(n, generator=gen)
    old_values = returns + 0.5 * torch.randn(n, generator=gen)
    values = old_values + 0.3 * torch.randn(n, generator=gen)
    return logits, actions, old_logp, advantages, values, old_values, returns


def _retrace_inputs(size, gen):
    """Q-values and target-policy logits over T + 1 states, behaviour actions and their probabilities."""
    t, b, a = (32, 16, 18) if size == "small" else (100, 4096, 18)
    q = torch.randn(t + 1, b, a, generator=gen)
    pi_logits = torch.randn(t + 1, b, a, generator=gen)
    mu = torch.randn(t, b, a, generator=gen).softmax(-1)
    actions = torch.multinomial(mu.reshape(-1, a), 1, generator=gen).view(t, b)
    mu_probs = mu.gather(-1, actions[..., None])[..., 0]
    rewards = torch.randn(t, b, generator=gen)
    discounts = 0.99 * (torch.rand(t, b, generator=gen) > 0.02).float()
    return q, pi_logits, actions, mu_probs, rewards, discounts


def _q_lambda_inputs(size, gen):
    """Q-values over T + 1 states and epsilon-greedy (epsilon = 0.1) behaviour actions."""
    t, b, a = (32, 16, 18) if size == "small" else (100, 4096, 18)
    q = torch.randn(t + 1, b, a, generator=gen)
    explore = torch.rand(t, b, generator=gen) < 0.1
    actions = torch.where(explore, torch.randint(0, a, (t, b), generator=gen), q[:-1].argmax(-1))
    rewards = torch.randn(t, b, generator=gen)
    discounts = 0.99 * (torch.rand(t, b, generator=gen) > 0.02).float()
    return q, actions, rewards, discounts


def _advantage_inputs(size, gen):
    """Flattened advantages of a rollout and its validity mask (steps after an env finished are padding)."""
    n = 2048 if size == "small" else 1 << 20
    advantages = 3.0 * torch.randn(n, generator=gen) + 0.5
    mask = (torch.rand(n, generator=gen) < 0.9).float()
    return advantages, mask


def _c51_inputs(size, gen):
    """Next-state return distributions (51 atoms) at the greedy action, clipped rewards and episode ends."""
    b, atoms = (32, 51) if size == "small" else (16_384, 51)
    next_probs = torch.randn(b, atoms, generator=gen).softmax(-1)
    rewards = torch.randint(-1, 2, (b,), generator=gen).float()
    dones = (torch.rand(b, generator=gen) < 0.1).float()
    return next_probs, rewards, dones


# ----------------------------------------------------------------------------------------------
# Return estimators
# ----------------------------------------------------------------------------------------------


def _discounted_returns_jax(rewards, dones, last_value, gamma=0.99):
    import jax

    def step(running, xs):
        r, d = xs
        running = r + gamma * running * (1.0 - d)
        return running, running

    return jax.lax.scan(step, last_value, (rewards, dones), reverse=True)[1]


@operator(
    domain="rl",
    tags=("view", "loop", "inplace"),
    reference="Sutton and Barto, Reinforcement Learning: An Introduction, 2nd ed., Sec. 3.3",
    inputs=_returns_inputs,
    jax=_discounted_returns_jax,
)
def discounted_returns(rewards, dones, last_value, gamma=0.99):
    """Bootstrapped discounted returns, accumulated backwards in time and reset at episode ends."""
    returns = torch.zeros_like(rewards)
    running = last_value
    for t in reversed(range(rewards.shape[0])):
        running = rewards[t] + gamma * running * (1.0 - dones[t])
        returns[t] = running
    return returns


def _gae_jax(rewards, values, dones, last_value, gamma=0.99, lam=0.95):
    import jax
    import jax.numpy as jnp

    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)

    def step(last_gae, xs):
        r, v, nv, d = xs
        not_done = 1.0 - d
        delta = r + gamma * nv * not_done - v
        last_gae = delta + gamma * lam * not_done * last_gae
        return last_gae, last_gae

    init = jnp.zeros_like(last_value)
    advantages = jax.lax.scan(step, init, (rewards, values, next_values, dones), reverse=True)[1]
    return advantages, advantages + values


@operator(
    domain="rl",
    tags=("view", "branch", "loop", "inplace"),
    reference="Schulman et al., Generalized Advantage Estimation (GAE), ICLR 2016",
    inputs=_rollout,
    jax=_gae_jax,
)
def gae(rewards, values, dones, last_value, gamma=0.99, lam=0.95):
    """GAE(gamma, lambda) advantages and the matching value targets (advantages + values)."""
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last_gae = torch.zeros_like(last_value)
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            next_value = last_value
        else:
            next_value = values[t + 1]
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * not_done - values[t]
        last_gae = delta + gamma * lam * not_done * last_gae
        advantages[t] = last_gae
    return advantages, advantages + values


def _td_lambda_returns_jax(rewards, values, dones, last_value, gamma=0.99, lam=0.95):
    import jax
    import jax.numpy as jnp

    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)

    def step(g, xs):
        r, nv, d = xs
        g = r + gamma * (1.0 - d) * ((1 - lam) * nv + lam * g)
        return g, g

    return jax.lax.scan(step, last_value, (rewards, next_values, dones), reverse=True)[1]


@operator(
    domain="rl",
    tags=("view", "loop", "broadcast", "inplace"),
    reference="Sutton and Barto, Reinforcement Learning: An Introduction, 2nd ed., Sec. 12.1 (lambda-return)",
    inputs=_rollout,
    jax=_td_lambda_returns_jax,
)
def td_lambda_returns(rewards, values, dones, last_value, gamma=0.99, lam=0.95):
    """Recursive lambda-returns: G_t = r_t + gamma (1 - done) ((1 - lambda) V(s_t+1) + lambda G_t+1)."""
    next_values = torch.cat((values[1:], last_value[None]), dim=0)
    returns = torch.empty_like(rewards)
    g = last_value
    for t in reversed(range(rewards.shape[0])):
        g = rewards[t] + gamma * (1.0 - dones[t]) * ((1 - lam) * next_values[t] + lam * g)
        returns[t] = g
    return returns


def _n_step_returns_jax(rewards, values, dones, last_value, n=5, gamma=0.99):
    import jax.numpy as jnp

    num_steps = rewards.shape[0]
    values_ext = jnp.concatenate([values, last_value[None]], axis=0)
    pad = jnp.zeros((n,) + rewards.shape[1:], rewards.dtype)
    r = jnp.concatenate([rewards, pad], axis=0)
    d = jnp.concatenate([dones, pad], axis=0)
    steps = jnp.arange(num_steps)
    g = jnp.zeros_like(rewards)
    discount = jnp.ones_like(rewards)
    for k in range(n):
        inside = (steps + k < num_steps)[:, None]
        g = jnp.where(inside, g + discount * r[k : k + num_steps], g)
        discount = jnp.where(inside, discount * gamma * (1.0 - d[k : k + num_steps]), discount)
    return g + discount * values_ext[jnp.minimum(steps + n, num_steps)]


@operator(
    domain="rl",
    tags=("view", "loop", "adv-index", "broadcast", "inplace"),
    reference="Mnih et al., Asynchronous Methods for Deep RL (A3C n-step returns), ICML 2016",
    inputs=_rollout,
    jax=_n_step_returns_jax,
)
def n_step_returns(rewards, values, dones, last_value, n=5, gamma=0.99):
    """n-step returns: up to n discounted rewards then the bootstrap value, truncated at episode ends."""
    num_steps = rewards.shape[0]
    values_ext = torch.cat((values, last_value.unsqueeze(0)), dim=0)
    returns = torch.zeros_like(rewards)
    for t in range(num_steps):
        end = min(t + n, num_steps)
        g = torch.zeros_like(last_value)
        discount = torch.ones_like(last_value)
        for k in range(t, end):
            g = g + discount * rewards[k]
            discount = discount * gamma * (1.0 - dones[k])
        returns[t] = g + discount * values_ext[end]
    return returns


# ----------------------------------------------------------------------------------------------
# Off-policy targets
# ----------------------------------------------------------------------------------------------


def _vtrace_targets_jax(
    behaviour_logp, target_logp, rewards, values, bootstrap_value, discounts, clip_rho=1.0, clip_pg_rho=1.0
):
    import jax
    import jax.numpy as jnp

    rhos = jnp.exp(target_logp - behaviour_logp)
    cs = jnp.minimum(rhos, 1.0)
    values_tp1 = jnp.concatenate([values[1:], bootstrap_value[None]], axis=0)
    deltas = jnp.minimum(rhos, clip_rho) * (rewards + discounts * values_tp1 - values)

    def step(acc, xs):
        delta, disc, c = xs
        acc = delta + disc * c * acc
        return acc, acc

    init = jnp.zeros_like(bootstrap_value)
    vs = jax.lax.scan(step, init, (deltas, discounts, cs), reverse=True)[1] + values
    vs_tp1 = jnp.concatenate([vs[1:], bootstrap_value[None]], axis=0)
    return vs, jnp.minimum(rhos, clip_pg_rho) * (rewards + discounts * vs_tp1 - values)


@operator(
    domain="rl",
    tags=("view", "loop", "container", "broadcast"),
    reference="Espeholt et al., IMPALA (V-trace off-policy correction), ICML 2018",
    inputs=_vtrace_inputs,
    jax=_vtrace_targets_jax,
)
def vtrace_targets(
    behaviour_logp, target_logp, rewards, values, bootstrap_value, discounts, clip_rho=1.0, clip_pg_rho=1.0
):
    """V-trace value targets v_s and policy-gradient advantages with truncated importance weights."""
    rhos = torch.exp(target_logp - behaviour_logp)
    clipped_rhos = rhos.clamp(max=clip_rho)
    cs = rhos.clamp(max=1.0)
    values_tp1 = torch.cat((values[1:], bootstrap_value[None]), dim=0)
    deltas = clipped_rhos * (rewards + discounts * values_tp1 - values)
    acc = torch.zeros_like(bootstrap_value)
    vs_minus_v = []
    for t in reversed(range(rewards.shape[0])):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v.append(acc)
    vs = torch.stack(vs_minus_v[::-1]) + values
    vs_tp1 = torch.cat((vs[1:], bootstrap_value[None]), dim=0)
    pg_advantages = rhos.clamp(max=clip_pg_rho) * (rewards + discounts * vs_tp1 - values)
    return vs, pg_advantages


def _retrace_targets_jax(q, pi_logits, actions, mu_probs, rewards, discounts, lam=1.0):
    import jax
    import jax.numpy as jnp

    pi = jax.nn.softmax(pi_logits, axis=-1)
    v = (pi * q).sum(-1)
    q_a = jnp.take_along_axis(q[:-1], actions[..., None], axis=-1)[..., 0]
    pi_a = jnp.take_along_axis(pi[:-1], actions[..., None], axis=-1)[..., 0]
    c = lam * jnp.minimum(pi_a / mu_probs, 1.0)

    def step(q_ret, xs):
        r, disc, c_t, qa_t, v_t = xs
        q_ret = r + disc * q_ret
        return c_t * (q_ret - qa_t) + v_t, q_ret

    return jax.lax.scan(step, v[-1], (rewards, discounts, c, q_a, v[:-1]), reverse=True)[1]


@operator(
    domain="rl",
    tags=("view", "reduction", "loop", "adv-index", "broadcast", "inplace"),
    reference="Munos et al., Safe and Efficient Off-Policy RL (Retrace), NeurIPS 2016; ACER recursion",
    inputs=_retrace_inputs,
    jax=_retrace_targets_jax,
)
def retrace_targets(q, pi_logits, actions, mu_probs, rewards, discounts, lam=1.0):
    """Retrace Q targets with truncated traces c_t = lambda min(1, pi(a_t) / mu(a_t))."""
    pi = F.softmax(pi_logits, dim=-1)
    v = (pi * q).sum(-1)
    q_a = q[:-1].gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    pi_a = pi[:-1].gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    c = lam * (pi_a / mu_probs).clamp(max=1.0)
    targets = torch.zeros_like(rewards)
    q_ret = v[-1]
    for t in reversed(range(rewards.shape[0])):
        q_ret = rewards[t] + discounts[t] * q_ret
        targets[t] = q_ret
        q_ret = c[t] * (q_ret - q_a[t]) + v[t]
    return targets


def _watkins_q_lambda_jax(q, actions, rewards, discounts, lam=0.9):
    import jax
    import jax.numpy as jnp

    q_max = q.max(-1)
    greedy = q.argmax(-1)
    q_a = jnp.take_along_axis(q[:-1], actions[..., None], axis=-1)[..., 0]
    trace = lam * (actions == greedy[:-1]).astype(q.dtype)

    def step(g, xs):
        r, disc, tr, qa_t, qmax_t = xs
        g = r + disc * g
        return tr * (g - qa_t) + qmax_t, g

    return jax.lax.scan(step, q_max[-1], (rewards, discounts, trace, q_a, q_max[:-1]), reverse=True)[1]


@operator(
    domain="rl",
    tags=("view", "reduction", "loop", "adv-index", "container", "broadcast"),
    reference="Watkins, Learning from Delayed Rewards, 1989; Sutton and Barto 2nd ed., Sec. 12.10",
    inputs=_q_lambda_inputs,
    jax=_watkins_q_lambda_jax,
)
def watkins_q_lambda(q, actions, rewards, discounts, lam=0.9):
    """Watkins Q(lambda) targets: greedy lambda-returns whose trace is cut at exploratory actions."""
    q_max, greedy = q.max(dim=-1)
    q_a = q[:-1].gather(-1, actions[..., None])[..., 0]
    trace = lam * (actions == greedy[:-1]).to(q.dtype)
    g = q_max[-1]
    targets = []
    for t in range(rewards.shape[0] - 1, -1, -1):
        g = rewards[t] + discounts[t] * g
        targets.append(g)
        g = trace[t] * (g - q_a[t]) + q_max[t]
    targets.reverse()
    return torch.stack(targets)


# ----------------------------------------------------------------------------------------------
# Policy optimisation
# ----------------------------------------------------------------------------------------------


def _ppo_loss_jax(
    logits, actions, old_logp, advantages, values, old_values, returns, clip=0.2, vf_coef=0.5, ent_coef=0.01
):
    import jax
    import jax.numpy as jnp

    logp_all = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logp_all, actions[:, None], axis=1)[:, 0]
    ratio = jnp.exp(logp - old_logp)
    adv = (advantages - advantages.mean()) / (advantages.std(ddof=1) + 1e-8)
    pg_loss = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip, 1 + clip) * adv).mean()
    v_clipped = old_values + jnp.clip(values - old_values, -clip, clip)
    vf_loss = 0.5 * jnp.maximum((values - returns) ** 2, (v_clipped - returns) ** 2).mean()
    entropy = -(jnp.exp(logp_all) * logp_all).sum(-1).mean()
    return pg_loss + vf_coef * vf_loss - ent_coef * entropy


@operator(
    domain="rl",
    tags=("view", "reduction", "adv-index", "broadcast"),
    reference="Schulman et al., Proximal Policy Optimization, 2017 (value clipping as in OpenAI baselines)",
    inputs=_ppo_inputs,
    differentiable=True,
    grad_argnums=(0, 4),
    jax=_ppo_loss_jax,
)
def ppo_loss(logits, actions, old_logp, advantages, values, old_values, returns, clip=0.2, vf_coef=0.5, ent_coef=0.01):
    """PPO objective: clipped surrogate + clipped value loss - entropy bonus, advantages normalised."""
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(1, actions[:, None]).squeeze(1)
    ratio = torch.exp(logp - old_logp)
    adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
    v_clipped = old_values + (values - old_values).clamp(-clip, clip)
    vf_loss = 0.5 * torch.max((values - returns) ** 2, (v_clipped - returns) ** 2).mean()
    entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    return pg_loss + vf_coef * vf_loss - ent_coef * entropy


def _minibatch_advantage_norm_jax(advantages, mask, num_minibatches=8):
    import jax.numpy as jnp

    adv = advantages.reshape(num_minibatches, -1)
    valid = mask.reshape(num_minibatches, -1) > 0
    count = valid.sum(1, keepdims=True)
    mean = jnp.where(valid, adv, 0.0).sum(1, keepdims=True) / count
    var = jnp.where(valid, (adv - mean) ** 2, 0.0).sum(1, keepdims=True) / (count - 1)
    return jnp.where(valid, (adv - mean) / (jnp.sqrt(var) + 1e-8), 0.0).reshape(-1)


@operator(
    domain="rl",
    tags=("view", "reduction", "loop", "adv-index", "input-dependent", "inplace"),
    reference="PPO minibatch advantage normalisation (OpenAI baselines ppo2); masked for padded rollouts",
    inputs=_advantage_inputs,
    jax=_minibatch_advantage_norm_jax,
)
def minibatch_advantage_norm(advantages, mask, num_minibatches=8):
    """Normalise advantages to zero mean / unit std within each minibatch, over valid steps only."""
    size = advantages.shape[0] // num_minibatches
    out = torch.zeros_like(advantages)
    for i in range(num_minibatches):
        chunk = advantages[i * size : (i + 1) * size]
        valid = mask[i * size : (i + 1) * size] > 0
        selected = chunk[valid]
        normed = (chunk - selected.mean()) / (selected.std() + 1e-8)
        out[i * size : (i + 1) * size] = torch.where(valid, normed, torch.zeros_like(normed))
    return out


# ----------------------------------------------------------------------------------------------
# Distributional RL
# ----------------------------------------------------------------------------------------------


def _c51_projection_jax(next_probs, rewards, dones, v_min=-10.0, v_max=10.0, gamma=0.99):
    import jax.numpy as jnp

    batch, atoms = next_probs.shape
    delta_z = (v_max - v_min) / (atoms - 1)
    support = jnp.linspace(v_min, v_max, atoms, dtype=next_probs.dtype)
    tz = jnp.clip(rewards[:, None] + (1.0 - dones[:, None]) * gamma * support[None, :], v_min, v_max)
    b = (tz - v_min) / delta_z
    lower = jnp.floor(b).astype(jnp.int32)
    upper = jnp.ceil(b).astype(jnp.int32)
    lower = jnp.where((upper > 0) & (lower == upper), lower - 1, lower)
    upper = jnp.where((lower < atoms - 1) & (lower == upper), upper + 1, upper)
    offset = (jnp.arange(batch) * atoms)[:, None]
    proj = jnp.zeros(batch * atoms, dtype=next_probs.dtype)
    proj = proj.at[(lower + offset).reshape(-1)].add((next_probs * (upper - b)).reshape(-1))
    proj = proj.at[(upper + offset).reshape(-1)].add((next_probs * (b - lower)).reshape(-1))
    return proj.reshape(batch, atoms)


@operator(
    domain="rl",
    tags=("view", "adv-index", "input-dependent", "broadcast", "inplace"),
    reference="Bellemare et al., A Distributional Perspective on RL (C51 categorical projection), ICML 2017",
    inputs=_c51_inputs,
    jax=_c51_projection_jax,
)
def c51_projection(next_probs, rewards, dones, v_min=-10.0, v_max=10.0, gamma=0.99):
    """Project the Bellman-shifted return distribution r + gamma z back onto the fixed atoms."""
    batch, atoms = next_probs.shape
    delta_z = (v_max - v_min) / (atoms - 1)
    support = torch.linspace(v_min, v_max, atoms)
    tz = (rewards[:, None] + (1.0 - dones[:, None]) * gamma * support[None, :]).clamp(v_min, v_max)
    b = (tz - v_min) / delta_z
    lower = b.floor().long()
    upper = b.ceil().long()
    # b exactly on an atom gives floor == ceil, whose mass would vanish: move one end to a neighbour
    on_atom_low = (upper > 0) & (lower == upper)
    lower[on_atom_low] -= 1
    on_atom_high = (lower < atoms - 1) & (lower == upper)
    upper[on_atom_high] += 1
    offset = (torch.arange(batch) * atoms)[:, None]
    proj = torch.zeros(batch * atoms, dtype=next_probs.dtype)
    proj.index_add_(0, (lower + offset).view(-1), (next_probs * (upper.to(b.dtype) - b)).view(-1))
    proj.index_add_(0, (upper + offset).view(-1), (next_probs * (b - lower.to(b.dtype))).view(-1))
    return proj.view(batch, atoms)
