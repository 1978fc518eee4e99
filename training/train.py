"""Stage two: train a CVAE from the entangled checkpoint with a weighted reconstruction.

setup -> fit -> validate (``validation.py``). ``run(cfg)`` is the whole job; the CLI only builds the config.
Outputs in RUN/: config.json (the resolved TrainConfig), metrics.jsonl (one line per
logged step, then the validation line), checkpoint/ (safetensors model + optimizer,
state.json, vocab.json; replaced atomically), and resume from it.

Data parallel (torchrun; gloo on CPU, NCCL on GPUs): the global batch of N * B examples
is drawn from ``lanes`` sample streams, each rank reading only its own lanes' shards
(``data.TrainStream``); gradients are averaged with one all_reduce per parameter, and the
terms that couple a batch's examples are computed over the global batch
(``global_batch.py``), so N ranks with batch B step like one process with batch N * B
and the same lanes. Rank 0 writes everything.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from itertools import islice
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from pipeline.checkpoint import load_checkpoint
from pipeline.model import GPT, ModelConfig
from pipeline.ranks import Ranks
from pipeline.labels import load_labels
from pipeline.vocab import Vocab
from training.baselines import POLICIES, Baseline, make_baseline
from training.cvae import CVAE, CVAEConfig, build_cvae, objective, spread_latent_embeddings
from training.data import (StoreRef, StreamSpec, TrainBatch, TrainStream, extract_command, shards_without_rows,
                           split_urls)
from training.estep import EStepConfig, em_objective, strategy_indices
from training.global_batch import GlobalBatch
from training.losses import (WEIGHTINGS, WeightingParams, check_free_bits, example_kl, reconstruction_weights,
                             weighted_reconstruction)
from training.metrics import entropy, posterior_gradient_norms
from training.schedules import BetaSchedule
from training.validation import validate


@dataclass(frozen=True)
class TrainConfig:
    checkpoint: str
    """The entangled checkpoint the CVAE is initialised from."""
    data: str
    """Dataset directory with train/ and val/ shards."""
    out: str
    """Run directory (config.json, metrics.jsonl, checkpoint/)."""
    store: str | None = None
    """Baseline store root; needed by policy 'precomputed' and weighting 'distribution-rescale'."""
    baseline_checkpoint: str | None = None
    """The checkpoint b was (or is) computed with; None: the init checkpoint."""
    cvae: CVAEConfig = field(default_factory=CVAEConfig)
    """Latent, z pathway and slots."""
    weighting: str = "surprisal-share"
    """Reconstruction weighting, one of losses.WEIGHTINGS."""
    token_weighted_reconstruction_weight: float = 1.0
    """lambda: (1 - lambda) * uniform + lambda * weighting."""
    eps: float = 1e-6
    """Weight-sum epsilon and degenerate threshold on sum_t b_t (nats)."""
    eps_inv: float = 1e-2
    """inverse-surprisal's floor under b (nats)."""
    policy: str = "precomputed"
    """Where b comes from: precomputed (store), frozen (extra pass), dynamic (current backbone)."""
    beta: BetaSchedule = field(default_factory=BetaSchedule)
    """The KL weight over training."""
    free_bits: float = 0.0
    """KL floor lambda in nats (0: off); refused at >= log K for a discrete latent."""
    estep: EStepConfig = field(default_factory=EStepConfig)
    """EM-style E-step from the decoder's own K passes (discrete latent; ``estep.py``); off by default."""
    latent_embedding_norm: float = 0.0
    """> 0: re-initialise the K latent token embeddings as orthogonal vectors of this norm before
    training (``cvae.spread_latent_embeddings``); 0 keeps the checkpoint's (nearly parallel) rows."""
    latent_embedding_center: bool = False
    """With latent_embedding_norm: offset the orthogonal rows from the checkpoint's mean latent row
    (kept out of their span) instead of replacing the rows. The base model has learnt to read that
    mean row as "a z, ignore it": the decoder starts intact (docs/latent-learnability.md)."""
    aggressive_steps: int = 0
    """Aggressive posterior updates (He et al. 2019): up to this many posterior-only steps on each
    batch, decoder fixed, until the posterior's objective stops improving; 0: off."""
    aggressive_until: int = 0
    """Training steps during which aggressive updates run (He et al. stop them once MI plateaus)."""
    steps: int = 300
    """Optimizer steps (global: every rank takes them all)."""
    batch_size: int = 32
    """Examples per step per rank."""
    lr: float = 1e-3
    """AdamW learning rate (constant)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0: off)."""
    log_every: int = 10
    """Steps between metrics.jsonl lines."""
    grad_diag_every: int = 50
    """Steps between posterior-gradient diagnostics (0: off)."""
    ckpt_every: int = 100
    """Steps between checkpoints (the last step always writes one)."""
    num_workers: int = 1
    """Loader worker processes (forkserver); 0 reads in the main process."""
    shuffle_buffer: int = 256
    """Examples in the seeded shuffle buffer (after the store join)."""
    eval_batch_size: int = 128
    """Examples per validation batch."""
    eval_every: int = 0
    """Steps between validations on the first ``eval_examples`` val examples, logged to metrics.jsonl (0: off)."""
    eval_examples: int = 256
    """Val examples of each periodic validation (rounded up to whole eval batches); the final one reads all."""
    seed: int = 0
    """Seeds the heads, the data order and the continuous latent's noise."""
    lanes: int | None = None
    """Sample streams the global batch is drawn from, each over its own shards (shard i in lane
    i % lanes), seeded and shuffled on its own; rank r reads only its lanes. The data order depends
    on lanes, not on ranks or workers: N ranks equal one process with the same global batch and
    lanes. None: one lane per rank."""
    device: str = "cpu"
    """torch device of the model; "cuda" under torchrun is cuda:LOCAL_RANK on each rank."""

    def __post_init__(self):
        if isinstance(self.cvae, dict):
            object.__setattr__(self, "cvae", CVAEConfig(**self.cvae))
        if isinstance(self.beta, dict):
            object.__setattr__(self, "beta", BetaSchedule(**self.beta))
        if isinstance(self.estep, dict):
            object.__setattr__(self, "estep", EStepConfig(**self.estep))
        discrete_only = {"estep": self.estep.mode != "off", "latent_embedding_norm": self.latent_embedding_norm > 0}
        if self.cvae.latent != "discrete" and any(discrete_only.values()):
            raise ValueError(f"{[k for k, on in discrete_only.items() if on]} need a discrete latent")
        if self.latent_embedding_norm < 0 or self.aggressive_steps < 0 or self.aggressive_until < 0:
            raise ValueError("latent_embedding_norm, aggressive_steps and aggressive_until must be >= 0")
        if self.latent_embedding_center and not self.latent_embedding_norm > 0:
            raise ValueError("latent_embedding_center needs latent_embedding_norm > 0 (the offset from the mean row)")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {sorted(WEIGHTINGS)}, got {self.weighting!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.store is None and (self.policy == "precomputed" or self.weighting == "distribution-rescale"):
            raise ValueError(f"policy {self.policy!r} with weighting {self.weighting!r} needs --store")
        if not 0 <= self.token_weighted_reconstruction_weight <= 1:
            raise ValueError("token_weighted_reconstruction_weight must be in [0, 1]")
        check_free_bits(self.free_bits, self.cvae.latent, self.cvae.k)
        for name in ("steps", "batch_size", "log_every", "ckpt_every", "eval_batch_size", "eval_examples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.lanes is not None and self.lanes < 1:
            raise ValueError(f"lanes must be >= 1 (or None: one per rank), got {self.lanes}")
        if min(self.num_workers, self.grad_diag_every, self.shuffle_buffer, self.eval_every) < 0:
            raise ValueError("num_workers, grad_diag_every, shuffle_buffer and eval_every must be >= 0")
        WeightingParams(self.eps, self.eps_inv)  # validates both

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> "TrainConfig":
        return cls(**obj)


# ---------------------------------------------------------------- setup


@dataclass
class State:
    cfg: TrainConfig
    model: CVAE
    opt: torch.optim.Optimizer
    baseline: Baseline
    params: WeightingParams
    spec: StreamSpec
    vocab: Vocab
    rank: int
    world: int
    device: torch.device
    step: int = 0
    meta: dict = field(default_factory=dict)
    post_opt: torch.optim.Optimizer | None = None  # aggressive posterior updates only
    strategy_names: tuple[str, ...] = ()  # estep mode "label": latent value k is strategy_names[k]
    input_bytes: int = 0  # bytes of shards and store parts this rank's training stream has read

    @property
    def global_batch(self) -> GlobalBatch:
        return GlobalBatch(self.rank, self.world)


def data_seed(seed: int, start_step: int) -> int:
    """The stream's seed: a resumed run draws a fresh (still deterministic) stream from its step."""
    return int(np.random.SeedSequence([seed, start_step]).generate_state(1)[0])


def setup(cfg: TrainConfig, ranks: Ranks) -> State:
    torch.manual_seed(cfg.seed)
    device = ranks.device(cfg.device)
    init = load_checkpoint(cfg.checkpoint)
    same = cfg.baseline_checkpoint is None or Path(cfg.baseline_checkpoint).resolve() == Path(cfg.checkpoint).resolve()
    base = init if same else load_checkpoint(cfg.baseline_checkpoint)
    if list(base.vocab.tokens) != list(init.vocab.tokens):
        raise ValueError(f"baseline checkpoint {base.path} and init checkpoint {init.path} have different vocabularies")
    baseline = make_baseline(cfg.policy, base.model.to(device))  # copies the checkpoint before any re-init
    model = build_cvae(init.model.train(), init.vocab, cfg.cvae).to(device)
    if cfg.latent_embedding_norm > 0:  # before resume: a resumed run loads its trained rows over these
        spread_latent_embeddings(model.backbone, model.latent.latent_ids.tolist(), cfg.latent_embedding_norm,
                                 torch.Generator().manual_seed(cfg.seed), center=cfg.latent_embedding_center)
    store = StoreRef(cfg.store, base.fingerprint) if cfg.store else None
    urls = split_urls(cfg.data, "train")
    dataset_mean_b = None
    if store is not None:
        view = store.open(init.vocab)  # fails early on a wrong fingerprint, vocabulary or incomplete store
        check_store_holds(cfg, view, urls + split_urls(cfg.data, "val"))
        if cfg.weighting == "distribution-rescale":
            dataset_mean_b = float(view.mean_example_mean_b(list(urls)))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    post_opt = (torch.optim.AdamW(model.posterior_parameters, lr=cfg.lr, betas=(0.9, 0.95))
                if cfg.aggressive_steps else None)
    state = State(cfg, model, opt, baseline,
                  WeightingParams(cfg.eps, cfg.eps_inv, dataset_mean_b), spec=None, vocab=init.vocab,
                  rank=ranks.rank, world=ranks.world, device=device, meta={"init_fingerprint": init.fingerprint, "baseline_fingerprint": base.fingerprint,
                                     "model_config": init.model.cfg.to_json(), "dataset_mean_b": dataset_mean_b},
                  post_opt=post_opt, strategy_names=label_names(cfg))
    resume(state)
    ranks.broadcast_tensors(model.parameters())  # identical starting points, whatever the ranks computed alone
    state.spec = StreamSpec(urls=urls, vocab=init.vocab, slots=cfg.cvae.slots, block_size=init.model.cfg.block_size,
                            batch_size=cfg.batch_size, store=store if cfg.policy == "precomputed" else None,
                            seed=data_seed(cfg.seed, state.step), shuffle_buffer=cfg.shuffle_buffer,
                            lanes=cfg.lanes or ranks.world)
    return state


def check_store_holds(cfg: TrainConfig, view, urls) -> None:
    """Before any step: every shard the run reads (train, and val for the validations) has stored rows."""
    missing = shards_without_rows(view, urls)
    if missing and cfg.policy == "precomputed":
        command = extract_command(cfg.baseline_checkpoint or cfg.checkpoint, cfg.data, cfg.store)
        raise ValueError(f"{len(missing)} shards (first {missing[0]}) have no rows in store {cfg.store}; "
                         f"add them with: {command}")


def label_names(cfg: TrainConfig) -> tuple[str, ...]:
    """The dataset's strategies in its labels' order (estep mode "label" only; empty otherwise)."""
    if cfg.estep.mode != "label":
        return ()
    strategies = load_labels(cfg.data).strategies
    if not strategies:
        raise ValueError(f'estep mode "label" needs a dataset whose {Path(cfg.data) / "dataset.json"} '
                         "lists its strategies (tokweight synth, or tokweight convert of labelled lines)")
    if len(strategies) > cfg.cvae.k:
        raise ValueError(f'estep mode "label": {len(strategies)} strategies {list(strategies)} '
                         f"need k >= {len(strategies)}, got k={cfg.cvae.k}")
    return strategies


def read_metrics(run: str | Path) -> list[dict]:
    """RUN/metrics.jsonl as records: the logged training steps, then the validation lines."""
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- checkpoints


def save_run_checkpoint(state: State) -> None:
    """RUN/checkpoint/: written under checkpoint.tmp, then swapped in (an interrupted save leaves the old one)."""
    out = Path(state.cfg.out)
    tmp, final = out / "checkpoint.tmp", out / "checkpoint"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in state.model.state_dict().items()}, tmp / "model.safetensors")
    opt_state = state.opt.state_dict()
    tensors = {f"{i}.{name}": t.detach().cpu().contiguous()
               for i, s in opt_state["state"].items() for name, t in s.items()}
    save_file(tensors or {"empty": torch.zeros(0)}, tmp / "optimizer.safetensors")
    state.vocab.save(tmp / "vocab.json")
    (tmp / "state.json").write_text(json.dumps({"step": state.step, "cvae": state.cfg.cvae.to_json(), **state.meta,
                                                "param_groups": opt_state["param_groups"]}, indent=1) + "\n")
    old = out / "checkpoint.old"
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def resume(state: State) -> None:
    """Load RUN/checkpoint/ if present; refuse one from another config or init checkpoint."""
    out, cfg = Path(state.cfg.out), state.cfg
    ckpt = out / "checkpoint"
    if not (ckpt / "state.json").is_file():
        return
    # read back through TrainConfig, so fields added since the run started compare at their defaults
    saved = TrainConfig.from_json(json.loads((out / "config.json").read_text())).to_json()
    mine = cfg.to_json()
    differ = sorted(k for k in mine if k not in ("steps",) and saved[k] != mine[k])
    if differ:
        raise ValueError(f"{out} holds a run with another config ({', '.join(differ)} differ); use a new --out")
    meta = json.loads((ckpt / "state.json").read_text())
    if meta["init_fingerprint"] != state.meta["init_fingerprint"]:
        raise ValueError(f"{ckpt} was trained from checkpoint {meta['init_fingerprint']}, "
                         f"not {state.meta['init_fingerprint']}")
    state.model.load_state_dict(load_file(ckpt / "model.safetensors"))
    flat = load_file(ckpt / "optimizer.safetensors")
    nested: dict[int, dict] = {}
    for name, t in flat.items():
        if name != "empty":
            i, key = name.split(".", 1)
            nested.setdefault(int(i), {})[key] = t
    state.opt.load_state_dict({"state": nested, "param_groups": meta["param_groups"]})
    state.step = int(meta["step"])


def load_run(run: str | Path, device: str = "cpu") -> tuple[TrainConfig, CVAE, Vocab, dict]:
    """(config, model in eval mode, vocabulary, checkpoint state.json) of a run directory."""
    run = Path(run)
    if not (run / "checkpoint" / "state.json").is_file():
        raise FileNotFoundError(f"{run}: no checkpoint/state.json (not a tokweight train run, or not started)")
    cfg = TrainConfig.from_json(json.loads((run / "config.json").read_text()))
    meta = json.loads((run / "checkpoint" / "state.json").read_text())
    vocab = Vocab.load(run / "checkpoint" / "vocab.json")
    model = build_cvae(GPT(ModelConfig(**meta["model_config"])), vocab, CVAEConfig(**meta["cvae"]))
    model.load_state_dict(load_file(run / "checkpoint" / "model.safetensors"))
    return cfg, model.to(device).eval(), vocab, meta


# ---------------------------------------------------------------- one step


def sample_generator(seed: int, step: int) -> torch.Generator:
    """The continuous latent's noise for one step's global batch, the same on every rank: a function
    of (seed, step), so resumes repeat it. (The 0 in the seed sequence was once the rank; kept, so
    that runs repeat the noise they drew before.)"""
    return torch.Generator().manual_seed(int(np.random.SeedSequence([seed, 0, step]).generate_state(1)[0]))


def step_objective(cfg: TrainConfig, latent, out, pi: torch.Tensor, beta: float, em: bool,
                   labels: torch.Tensor | None, batch: GlobalBatch):
    """The E-step objective (``estep.em_objective``) while it is active, else the plain one.
    Under the E-step ``recon`` is reported, not optimised, so the gradient diagnostic reads 0 there."""
    if em:
        return em_objective(latent, out, pi, beta, cfg.free_bits, cfg.estep, labels, batch)
    return objective(latent, out, pi, beta, cfg.free_bits, batch)


def forward_backward(state: State, batch: TrainBatch) -> dict:
    cfg, model, step = state.cfg, state.model, state.step
    out = model(batch, generator=sample_generator(cfg.seed, step), global_batch=state.global_batch)
    mask = batch.zfree.mask
    b = state.baseline(batch, out)  # (B, T_max) nats over S, detached
    pi, degenerate = reconstruction_weights(cfg.weighting, b, mask, state.params, cfg.token_weighted_reconstruction_weight,
                                            state.global_batch)
    beta = cfg.beta.at(step, cfg.steps)
    em = cfg.estep.active(step)
    labels = strategy_indices(batch.strategies, state.strategy_names, batch.keys) if em and state.strategy_names else None
    if cfg.aggressive_steps and step < cfg.aggressive_until:
        out.post = aggressive_posterior_updates(state, batch, out, pi, beta, em, labels)
    obj = step_objective(cfg, model.latent, out, pi, beta, em, labels, state.global_batch)
    record = {"step": step, "loss": obj.loss.item(), "recon": obj.recon.item(),
              "kl": example_kl(obj.kl).mean().item(), "kl_term": obj.kl_term.item(), "beta": beta,
              "degenerate": int(degenerate.sum()), "estep": em, **latent_summary(model, out, batch, state.params, pi)}
    if cfg.grad_diag_every and step % cfg.grad_diag_every == 0:
        record |= posterior_gradient_norms(obj.recon, beta * obj.kl_term, model.posterior_parameters)
    state.opt.zero_grad(set_to_none=True)
    obj.loss.backward()
    return record


def aggressive_posterior_updates(state: State, batch: TrainBatch, out, pi: torch.Tensor, beta: float, em: bool,
                                 labels: torch.Tensor | None = None):
    """He et al. 2019: optimise the posterior alone, decoder outputs fixed, until its objective
    stops improving (at most ``aggressive_steps`` steps); returns the posterior recomputed with
    the updated parameters, still attached to the shared backbone's graph for the joint step.

    The posterior's objective is the step's own (plain or E-step) with R and the prior detached.
    Under data parallelism the ranks stop together, on the global batch's objective, and
    average the posterior's gradients, so their posteriors stay equal.
    """
    cfg, model, batch_of_all = state.cfg, state.model, state.global_batch
    fixed = replace(out, nll=out.nll.detach(), prior=detach(out.prior))
    shared_input = out.pooled.detach() if model.encoder is None else None

    def posterior_loss() -> torch.Tensor:
        pooled = shared_input if shared_input is not None else model.posterior_input(batch)
        return step_objective(cfg, model.latent, replace(fixed, post=model.latent.posterior(pooled)), pi, beta, em,
                              labels, batch_of_all).loss

    best = float("inf")
    for _ in range(cfg.aggressive_steps):
        loss = posterior_loss()
        value = batch_of_all.mean(loss.detach()[None]).item()
        if value > best - 1e-4:
            break
        best = value
        state.post_opt.zero_grad(set_to_none=True)
        loss.backward()
        average_gradients(model.posterior_parameters, state.world)
        state.post_opt.step()
    return model.latent.posterior(out.pooled if model.encoder is None else model.posterior_input(batch))


def detach(value):
    return value.detach() if isinstance(value, torch.Tensor) else tuple(v.detach() for v in value)


@torch.no_grad()
def latent_summary(model: CVAE, out, batch: TrainBatch, params: WeightingParams, pi: torch.Tensor) -> dict:
    """Uniform reconstruction E_q[sum_t l_t / T]; discrete: mean H(q), the spreads
    mean_i (max_k R_ik - min_k R_ik) of the uniform R and of the trained (weighted, ``pi``) R
    across latent values, usage mean_i q_i, and argmin_usage: the share of examples whose
    weighted R is lowest at k (where a hard E-step would send them)."""
    pi_u, _ = reconstruction_weights("uniform", out.zfree_nll, batch.zfree.mask, params)
    R = weighted_reconstruction(out.nll, pi_u)  # (B, copies)
    summary = {"recon_uniform": model.latent.expectation(R, out.post).mean().item()}
    if model.latent.kind == "discrete":
        q = out.post.exp()
        Rw = weighted_reconstruction(out.nll, pi.to(out.nll.dtype))  # (B, K)
        winners = torch.bincount(Rw.argmin(1), minlength=model.latent.k) / len(Rw)
        summary |= {"q_entropy": float(entropy(q.cpu().numpy()).mean()),
                    "R_spread": (R.max(1).values - R.min(1).values).mean().item(),
                    "R_spread_weighted": (Rw.max(1).values - Rw.min(1).values).mean().item(),
                    "usage": q.mean(0).tolist(), "argmin_usage": winners.tolist()}
    return summary


def average_gradients(params, world: int) -> None:
    """The ranks' mean gradient on every rank: the gradient of the global batch's mean."""
    if world == 1:
        return
    import torch.distributed as dist

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad.div_(world)


def optimizer_step(state: State) -> None:
    params = [p for p in state.model.parameters() if p.requires_grad]
    average_gradients(params, state.world)
    if state.cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(params, state.cfg.grad_clip)
    state.opt.step()


# ---------------------------------------------------------------- fit


def fit(state: State) -> None:
    cfg, out = state.cfg, Path(state.cfg.out)
    if state.step >= cfg.steps:
        return
    stream = TrainStream(state.spec, state.rank, state.world)
    batches = islice(stream.batches(cfg.num_workers), cfg.steps - state.step)
    log = (out / "metrics.jsonl").open("a") if state.rank == 0 else None
    bar = tqdm(total=cfg.steps, initial=state.step, desc="train", unit="step", disable=state.rank != 0,
               mininterval=1.0)
    try:
        for batch in batches:
            record = forward_backward(state, batch.to(state.device))
            optimizer_step(state)
            state.step += 1
            bar.update(1)
            if log and (state.step % cfg.log_every == 0 or state.step == cfg.steps or "grad_recon" in record):
                log.write(json.dumps(record) + "\n")
                log.flush()
                bar.set_postfix(loss=f"{record['loss']:.3f}", kl=f"{record['kl']:.3f}")
            if cfg.eval_every and state.step % cfg.eval_every == 0 and state.step != cfg.steps:
                validate(state, examples=cfg.eval_examples)
            if state.rank == 0 and (state.step % cfg.ckpt_every == 0 or state.step == cfg.steps):
                save_run_checkpoint(state)
    finally:
        bar.close()
        if log:
            log.close()
        state.input_bytes += stream.bytes_read


def run(cfg: TrainConfig) -> dict:
    """The whole job; the result holds the final validation's metrics, the training wall time and
    ``input_bytes_read``: each rank's bytes of shards and store parts read by its training stream."""
    ranks = Ranks(timeout_s=120.0, backend="nccl" if cfg.device.startswith("cuda") else "gloo")
    try:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        state = setup(cfg, ranks)
        if ranks.is_main:
            (out / "config.json").write_text(json.dumps(cfg.to_json(), indent=1) + "\n")
        t0 = time.perf_counter()
        fit(state)
        wall = time.perf_counter() - t0
        metrics = validate(state)
        return {**metrics, "train_wall_s": wall, "input_bytes_read": ranks.gather(state.input_bytes)}
    finally:
        ranks.close()
