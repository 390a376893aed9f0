"""Loop oracles: plain per-client, per-class (or per-pair) versions of the vectorized
production code, used only by the tests and the benchmarks as references.

  train_clients_loop     fedlib.training.train_clients     one client after another, torch.optim.SGD
  probe_loop             fedlib.methods.celm.probe          one model, one class, one Adam at a time
  supcon_loss_loop       fedlib.methods.flce.supcon_loss    FLCE Eq. 4 term by term
  class_prototypes_loop  fedlib.methods.flce.class_prototypes  one client, one class at a time
  stability_loop         fedlib.methods.scm.stability       plain loop over pairs of runs
  logit_protocol_loop    fedlib.methods.logit (LogitFL)     the logit protocol as its own round loop
  client_probabilities_loop  fedlib.scm_pipeline.client_probabilities  one client model after another
  cohort_training_loop   method ``cohort`` on the engine      FedSCM's post-training as its own round loop
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .engine import _round_generator
from .federation import prepare
from .methods import logit as agg
from .population import (
    ClientBatches,
    LocalTraining,
    ParamLayout,
    aggregate,
    make_client_batches,
    predict,
)
from .training import train_clients


def crop_flip_one(img: torch.Tensor, code: int, fill, pad: int = 4) -> torch.Tensor:
    """One image ``[C, H, W]`` padded with ``fill`` (per channel), cropped at the code's (dy, dx) and
    mirrored when the code's flip bit is set: the oracle of ``population.crop_flip``."""
    side = 2 * pad + 1
    flip, dy, dx = code // (side * side), (code // side) % side, code % side
    c, h, w = img.shape
    canvas = torch.tensor(fill, dtype=img.dtype).view(c, 1, 1).repeat(1, h + 2 * pad, w + 2 * pad)
    canvas[:, pad:pad + h, pad:pad + w] = img
    out = canvas[:, dy:dy + h, dx:dx + w]
    return out.flip(-1) if flip else out


def train_clients_loop(
    model: nn.Module,
    start: torch.Tensor,
    buffers: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    batches: ClientBatches,
    cfg: LocalTraining,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Reference implementation: one client after another with torch.optim.SGD on the
    same batches (real samples only). Test oracle and benchmark baseline only."""
    layout = ParamLayout(model)
    n = batches.index.shape[1]
    flats, bufs_out = [], []
    for i in range(n):
        local = copy.deepcopy(model).train()
        start_i = start if start.dim() == 1 else start[i]
        buf_i = {k: (v[0] if v.shape[0] == 1 else v[i]) for k, v in buffers.items()}
        layout.load_into(local, start_i, buf_i)
        anchor = start_i.detach().clone()
        lr = float(cfg.lr[i]) if torch.is_tensor(cfg.lr) else cfg.lr
        opt = torch.optim.SGD(local.parameters(), lr=lr, momentum=cfg.momentum,
                              weight_decay=cfg.weight_decay)
        ctx = None if cfg.client_context is None else torch.utils._pytree.tree_map(
            lambda t: t[i], cfg.client_context
        )
        for s in range(batches.steps):
            real = batches.mask[s, i] > 0
            if not bool(real.any()):
                continue
            idx = batches.index[s, i][real]
            xb, yb = x[idx], y[idx]
            if batches.codes is not None:  # one sample at a time, by slicing
                xb = torch.stack([crop_flip_one(img, int(code), cfg.augment_fill)
                                  for img, code in zip(xb, batches.codes[s, i][real])])
            opt.zero_grad()
            if cfg.extra_loss is None:
                logits = local(xb)
            else:
                logits, features = local(xb, return_features=True)
            loss = F.cross_entropy(logits, yb)
            if cfg.prox_mu:
                current = layout.flatten(dict(local.named_parameters()))
                loss = loss + 0.5 * cfg.prox_mu * (current - anchor).square().sum()
            if cfg.extra_loss is not None:
                params = dict(local.named_parameters())
                kwargs = {"inputs": xb} if cfg.extra_loss_inputs else {}
                loss = loss + cfg.extra_loss(params, logits, features, yb,
                                             torch.ones(len(yb)), ctx, **kwargs)
            loss.backward()
            opt.step()
        flats.append(layout.flat_of(local))
        bufs_out.append(layout.buffers_of(local))
    flat = torch.stack(flats)
    bufs = {k: torch.stack([b[k] for b in bufs_out]) for k in buffers}
    return flat, bufs


def probe_loop(model: nn.Module, flats: torch.Tensor, buffers: dict[str, torch.Tensor], images: torch.Tensor,
               steps: int, lr: float, l2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for :func:`probe`: one model, one class, one ``torch.optim.Adam`` at a time."""
    layout = ParamLayout(model)
    local = copy.deepcopy(model).eval().requires_grad_(False)
    u = images.new_empty(images.shape[:2])
    final = torch.empty_like(images)
    for m in range(images.shape[0]):
        layout.load_into(local, flats[m], {k: v[m] for k, v in buffers.items()})
        for c in range(images.shape[1]):
            x = images[m, c : c + 1].clone().requires_grad_(True)
            optimizer = torch.optim.Adam([x], lr=lr)
            for _ in range(steps):
                optimizer.zero_grad()
                (-(local(x)[0, c] - l2 * x.square().sum())).backward()
                optimizer.step()
            with torch.no_grad():
                u[m, c] = local(x)[0, c]
            final[m, c] = x.detach()[0]
    return u, final


def supcon_loss_loop(z: torch.Tensor, y: torch.Tensor, tau: float, self_pair: bool = True) -> torch.Tensor:
    """Reference for :func:`supcon_loss` (real samples only): Eq. 4 term by term."""
    n = len(y)
    total = z.new_zeros(())
    for i in range(n):
        sims = [F.cosine_similarity(z[i], z[k], dim=0) / tau for k in range(n)]
        denominator = sum(torch.exp(sims[k]) for k in range(n) if k != i)
        positives = [j for j in range(n) if (self_pair or j != i) and y[j] == y[i]]
        for j in positives:
            total = total - torch.log(torch.exp(sims[j]) / denominator) / len(positives)
    return total / n


def class_prototypes_loop(model, flat, buffers, x, y, indices, n_classes):
    """Reference for :func:`class_prototypes`: one client, one class at a time."""
    layout = ParamLayout(model)
    local = copy.deepcopy(model).eval()
    protos, counts = [], []
    for i, ix in enumerate(indices):
        layout.load_into(local, flat[i], {k: v[i] for k, v in buffers.items()})
        ix = torch.as_tensor(ix)
        with torch.no_grad():
            logits, z = local(x[ix], return_features=True)
        correct = logits.argmax(-1) == y[ix]
        rows, row_counts = [], []
        for c in range(n_classes):
            keep = correct & (y[ix] == c)
            rows.append(z[keep].mean(0) if keep.any() else z.new_zeros(z.shape[1]))
            row_counts.append(float(keep.sum()))
        protos.append(torch.stack(rows))
        counts.append(torch.tensor(row_counts))
    return torch.stack(protos), torch.stack(counts)


def stability_loop(selections) -> dict[str, float]:
    """Plain loop over pairs of runs: the test oracle of :func:`stability`."""
    s = np.asarray(selections, dtype=bool)
    rows = []
    for i in range(len(s)):
        for j in range(i + 1, len(s)):
            a, b = s[i], s[j]
            inter, union, xor = (a & b).sum(), (a | b).sum(), (a ^ b).sum()
            rows.append([xor / max(union, 1), xor / max(a.sum() + b.sum(), 1),
                         1 - inter / max(np.sqrt(a.sum() * b.sum()), 1e-12),
                         1 - 2 * inter / max(a.sum() + b.sum(), 1), inter / max(union, 1)])
    rows = np.mean(rows, 0)
    ent = []
    for f in s.mean(0):
        ent.append(0.0 if f in (0.0, 1.0) else -(f * np.log2(f) + (1 - f) * np.log2(1 - f)))
    return {"D.R.": rows[0], "Hamming": rows[1], "Entropy": float(np.mean(ent)), "Cosine": rows[2], "F1": rows[3],
            "Jaccard": rows[4]}


def logit_protocol_loop(config) -> list[dict]:
    """The logit-based protocol as its own round loop (the loop ``fedlib/logit_run.py`` ran before
    the protocol became engine methods): per round the test accuracy of the aggregated ensemble,
    the public-set accuracy and each client's test accuracy. ``config``: a RunConfig whose method
    is ``logit_simple``, ``logit_uwa`` or ``logit_meta``. Oracle of ``fedlib.methods.logit``."""
    p = prepare(config)
    m, model = p.method, p.model
    n, c, aggregator = config.n_clients, p.dataset.num_classes, config.method.name.removeprefix("logit_")
    x_pub, y_pub = p.x_val, p.y_val
    train_idx, val_table, val_valid = agg.split_validation(p.partition.indices, m.val_fraction, config.seed)
    x_all = torch.cat([x_pub, p.x_test, p.x_pool[val_table.flatten()]])
    n_pub, n_test, width = len(y_pub), len(p.y_test), val_table.shape[1]
    if aggregator == "uwa":
        if m.gmm_components is None:
            init_resp = F.one_hot(p.y_pool[val_table], c).float()
        else:
            draw = torch.randint(m.gmm_components, val_table.shape, generator=torch.Generator().manual_seed(config.seed))
            init_resp = F.one_hot(draw, m.gmm_components).float()
    layout = ParamLayout(model)
    flat, bufs = layout.flat_of(model), {k: v.unsqueeze(0) for k, v in layout.buffers_of(model).items()}
    rng = np.random.default_rng(config.seed)
    pub_all, empty = np.arange(n_pub), np.zeros(0, dtype=np.int64)
    distill = LocalTraining(epochs=m.distill_epochs, batch_size=config.batch_size, lr=m.distill_lr or config.lr,
                            momentum=config.momentum, chunk_size=config.client_chunk,
                            extra_loss=lambda params, out, feats, yb, mb, ctx: agg.distillation_loss(out, yb, mb,
                                                                                                     m.temperature))

    def refine(flat, bufs, targets, present_np, gen):
        batches = make_client_batches([pub_all if on else empty for on in present_np], config.batch_size,
                                      m.distill_epochs, gen)
        return train_clients(model, flat, bufs, x_pub, targets, batches, distill)

    history, targets = [], None
    for t in range(config.rounds):
        gen = torch.Generator().manual_seed((config.seed * 1_000_003 + t * 7_919 + 1) % (2**63))
        present_np = rng.random(n) >= m.dropout
        if not present_np.any():
            present_np[rng.integers(n)] = True
        present = torch.from_numpy(present_np)
        local = LocalTraining(epochs=config.local_epochs, batch_size=config.batch_size, lr=config.lr,
                              momentum=config.momentum, chunk_size=config.client_chunk)
        batches = make_client_batches([ix if on else empty for ix, on in zip(train_idx, present_np)],
                                      config.batch_size, config.local_epochs, gen)
        flat, bufs = train_clients(model, flat, bufs, p.x_pool, p.y_pool, batches, local)
        if m.public_logits == "after_refine" and targets is not None and m.distill_epochs:
            flat, bufs = refine(flat, bufs, targets, present_np, gen)
        logits = predict(model, flat, bufs, x_all, batch_size=512)
        pub, test = logits[:, :n_pub], logits[:, n_pub:n_pub + n_test]
        val = logits[:, n_pub + n_test:].reshape(n, n, width, c).diagonal(dim1=0, dim2=1).permute(2, 0, 1)
        if aggregator == "simple":
            agg_pub, agg_test = agg.simple_average(pub, present), agg.simple_average(test, present)
        elif aggregator == "uwa":
            gmm = agg.fit_gmm(val, val_valid, init_resp, m.gmm_iters, m.reg_covar)
            ll_pub, ll_test = agg.gmm_log_likelihood(gmm, pub), agg.gmm_log_likelihood(gmm, test)
            if m.uwa_score == "standardized":
                ll_pub, ll_test = agg.standardize_scores(agg.gmm_log_likelihood(gmm, val), val_valid, ll_pub, ll_test)
            agg_pub, _ = agg.uwa_aggregate(pub, ll_pub, present, m.uwa_tau)
            agg_test, _ = agg.uwa_aggregate(test, ll_test, present, m.uwa_tau)
        else:
            lab = slice(0, m.meta_labeled)
            meta = agg.train_meta_model(pub[:, lab], y_pub[lab], c, hidden=m.meta_hidden, steps=m.meta_steps,
                                        lr=m.meta_lr, drop=m.meta_drop, present=present, seed=config.seed * 1000 + t)
            agg_pub, agg_test = agg.meta_aggregate(meta, pub, present), agg.meta_aggregate(meta, test, present)
        history.append({"accuracy": float((agg_test.argmax(-1) == p.y_test).float().mean()),
                        "public_accuracy": float((agg_pub.argmax(-1) == y_pub).float().mean()),
                        "client_accuracy": (test.argmax(-1) == p.y_test).float().mean(1).tolist(),
                        "present": present_np.tolist()})
        targets = torch.softmax(agg_pub, dim=-1).detach()
        if m.public_logits == "after_local" and t + 1 < config.rounds and m.distill_epochs:
            flat, bufs = refine(flat, bufs, targets, present_np, gen)
    return history


def client_probabilities_loop(model, flat, buffers, x, batch_size=1024) -> torch.Tensor:
    """The same, one client after another: the test oracle and benchmark baseline."""
    layout = ParamLayout(model)
    local = copy.deepcopy(model).eval()
    out = []
    with torch.no_grad():
        for i in range(flat.shape[0]):
            layout.load_into(local, flat[i], {k: v[i] for k, v in buffers.items()})
            out.append(torch.cat([torch.softmax(local(x[s:s + batch_size]).float(), -1)
                                  for s in range(0, len(x), batch_size)]))
    return torch.stack(out)


def cohort_training_loop(model, init, x, y, indices, weights, rounds: int, training: LocalTraining, seed: int,
                         per_round: int | None = None):
    """FedSCM's post-selection training (Algorithm 2, steps 4-5) as a plain round loop: each round
    all clients (or ``per_round`` drawn as the engine draws them) train from the global model,
    one after another (``train_clients_loop``), on the engine's batches for that round, and the
    server takes Σ λ_k w_k / Σ λ_k over them. Returns the final (flat, buffers)."""
    rng = np.random.default_rng(seed)
    lam = torch.as_tensor(weights, dtype=torch.float64)
    flat, bufs = init
    n = len(indices)
    for t in range(rounds):
        pick = np.arange(n) if not per_round or per_round >= n else np.sort(rng.choice(n, size=per_round,
                                                                                       replace=False))
        batches = make_client_batches([indices[c] for c in pick], training.batch_size, training.epochs,
                                      _round_generator(seed, t, "cpu"))
        if training.max_steps is not None:
            batches = ClientBatches(batches.index[: training.max_steps], batches.mask[: training.max_steps])
        local, local_bufs = train_clients_loop(model, flat, {k: v.unsqueeze(0) for k, v in bufs.items()}, x, y,
                                               batches, training)
        w = lam[torch.as_tensor(pick)]
        flat, bufs = aggregate(local, (w / w.sum()).float(), local_bufs)
    return flat, bufs
