"""One ViT-B/16 training step in plain JAX/XLA on one GPU: do Rosetta's published B/16 rows measure the GPU?

Prepared for issue 15: echosim predicts NVIDIA JAX-Toolbox Rosetta's ViT-B/16 pre-training rows (8x A100 7,200
images/s, 8x H100 11,670; 512 images per GPU, bf16 compute over fp32 parameters) too fast by +45.7% and +98.4%, a
near-constant ~0.18 s a step on both devices, which reads like a host cost (DALI on the host CPU), not a device rate.
This script times what the GPU alone does for that step, with no input pipeline: the model of Rosetta's
configs/base.gin (hidden 768, 12 layers, 12 heads, MLP 3072, tanh pre-logits 768, dropout 0.1 after the position
embeddings, the attention output and both MLP layers, none on the attention probabilities; query, key and value in
three projections and scores materialised, as flax's MultiHeadDotProductAttention; patches embedded by a 16x16
stride-16 convolution and flax's tanh-approximate GELU, as Rosetta's layers.py), bf16 compute with fp32
parameters (flax ``dtype=bfloat16``), softmax cross-entropy on 1,000 classes, backward, and AdamW in fp32 after
global-norm clipping; random images already on the device; jit-compiled with donated state, timed after warm-up.
Dropout masks come from ``jax.random`` with the default threefry PRNG (Rosetta's pretrain.gin sets
``USE_HARDWARE_RNG = False``, i.e. software RNG); variants time it without dropout, with ``unsafe_rbg`` keys (what
t5x's utils.set_hardware_rng_ops selects for hardware RNG), at batch 256, with ``jax.nn.dot_product_attention``
(cuDNN fused attention) and with XLA's latency-hiding scheduler on (no collectives on one GPU: it should not
matter). Plain JAX only (no flax/optax), so the script needs nothing but jax. Not a test: it needs a GPU. It writes
the JSON after each variant, so a run cut short keeps what it measured, and starts no new variant after ``BUDGET_S``
seconds.

    python3 benchmarks/vit_jax_gpu_check.py [out.json] [--tiny]

``--tiny`` runs 2 layers of width 64 on 32x32 images at batch 4 (a CPU smoke test of the code path).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from datetime import datetime, timezone

BUDGET_S = 110.0  # start no new variant after this many seconds (the device lease is short)


def main() -> int:
    out_path = next((a for a in sys.argv[1:] if not a.startswith("--")), "vit_jax_gpu_check.json")
    tiny = "--tiny" in sys.argv
    t_start = time.perf_counter()
    result: dict = {"script": "benchmarks/vit_jax_gpu_check.py", "when_utc": datetime.now(timezone.utc).isoformat(),
                    "python": platform.python_version(), "tiny": tiny, "rows": []}  # fmt: skip

    def save() -> None:
        with open(out_path, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)

    try:
        import jax
        import jax.numpy as jnp
    except Exception as exc:
        result["error"] = f"jax import failed: {exc!r}"
        print(result["error"])
        save()
        return 0
    devices = jax.devices()
    result.update(jax=jax.__version__, backend=jax.default_backend(), devices=[str(d) for d in devices],
                  device_kind=devices[0].device_kind, xla_flags=os.environ.get("XLA_FLAGS", ""))  # fmt: skip
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {devices}", flush=True)
    if jax.default_backend() != "gpu" and not tiny:
        result["error"] = "jax has no GPU backend here; nothing measured"
        print(result["error"])
        save()
        return 0

    if tiny:
        cfg = dict(image=32, patch=16, hidden=64, layers=2, heads=4, mlp=128, rep=64, classes=1000)
    else:  # Rosetta configs/base.gin: ViT-B/16 at 224x224, REP_SIZE 768, ImageNet-1k
        cfg = dict(image=224, patch=16, hidden=768, layers=12, heads=12, mlp=3072, rep=768, classes=1000)
    result["model"] = cfg
    bf16, f32 = jnp.bfloat16, jnp.float32
    p, d, h, f = cfg["patch"], cfg["hidden"], cfg["heads"], cfg["mlp"]
    tokens = (cfg["image"] // p) ** 2 + 1

    def init_params(key: jax.Array) -> dict:
        """fp32 parameters, ViT-B/16 shapes (values do not matter for timing)."""
        ks = iter(jax.random.split(key, 16 + 16 * cfg["layers"]))

        def dense(n_in: int, n_out: int) -> dict:
            return {"w": jax.random.normal(next(ks), (n_in, n_out), f32) / math.sqrt(n_in), "b": jnp.zeros(n_out, f32)}

        def ln() -> dict:
            return {"g": jnp.ones(d, f32), "b": jnp.zeros(d, f32)}

        layers = [{"ln1": ln(), "q": dense(d, d), "k": dense(d, d), "v": dense(d, d), "o": dense(d, d),
                   "ln2": ln(), "fc1": dense(d, f), "fc2": dense(f, d)} for _ in range(cfg["layers"])]  # fmt: skip
        embed = {"w": jax.random.normal(next(ks), (p, p, 3, d), f32) / math.sqrt(p * p * 3), "b": jnp.zeros(d, f32)}
        return {"embed": embed, "cls": jnp.zeros((1, 1, d), f32),
                "pos": 0.02 * jax.random.normal(next(ks), (1, tokens, d), f32), "layers": layers,
                "ln_f": ln(), "pre": dense(d, cfg["rep"]), "head": dense(cfg["rep"], cfg["classes"])}  # fmt: skip

    def layer_norm(x: jax.Array, prm: dict) -> jax.Array:
        """flax LayerNorm(dtype=bf16): statistics in fp32, output in bf16."""
        x32 = x.astype(f32)
        mean = x32.mean(-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + 1e-6) * prm["g"] + prm["b"]
        return y.astype(bf16)

    def linear(x: jax.Array, prm: dict) -> jax.Array:
        """flax Dense(dtype=bf16): input and fp32 kernel cast to bf16."""
        return x.astype(bf16) @ prm["w"].astype(bf16) + prm["b"].astype(bf16)

    def forward(params: dict, images: jax.Array, key: jax.Array | None, rate: float, attention: str) -> jax.Array:
        b = images.shape[0]
        keys = iter(jax.random.split(key, 4 + 3 * cfg["layers"])) if key is not None and rate > 0 else None

        def dropout(x: jax.Array) -> jax.Array:
            if keys is None:
                return x
            keep = jax.random.bernoulli(next(keys), 1.0 - rate, x.shape)
            return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)

        # flax Conv(kernel 16x16, stride 16, VALID, dtype=bf16) on NHWC images, as Rosetta's layers.py embeds patches
        x = jax.lax.conv_general_dilated(images.astype(bf16), params["embed"]["w"].astype(bf16), (p, p), "VALID",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))  # fmt: skip
        x = (x + params["embed"]["b"].astype(bf16)).reshape(b, -1, d)
        x = jnp.concatenate([jnp.broadcast_to(params["cls"].astype(bf16), (b, 1, d)), x], axis=1)
        x = dropout(x + params["pos"].astype(bf16))
        for lp in params["layers"]:
            y = layer_norm(x, lp["ln1"])
            q, k, v = (linear(y, lp[n]).reshape(b, tokens, h, d // h) for n in ("q", "k", "v"))
            if attention == "cudnn":
                a = jax.nn.dot_product_attention(q, k, v, implementation="cudnn")
            elif attention == "xla-sdpa":
                a = jax.nn.dot_product_attention(q, k, v, implementation="xla")
            else:  # flax dot_product_attention_weights: scores materialised, softmax, then weights x values
                s = jnp.einsum("bqhd,bkhd->bhqk", q / jnp.sqrt(d // h).astype(bf16), k)
                a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s), v)
            x = x + dropout(linear(a.reshape(b, tokens, d), lp["o"]))
            y = layer_norm(x, lp["ln2"])
            y = dropout(jax.nn.gelu(linear(y, lp["fc1"]), approximate=True))  # t5x 'gelu' -> flax nn.gelu (tanh)
            x = x + dropout(linear(y, lp["fc2"]))
        x = layer_norm(x, params["ln_f"])[:, 0]
        x = jnp.tanh(linear(x, params["pre"]))
        return linear(x, params["head"]).astype(f32)

    def loss_fn(params: dict, images: jax.Array, labels: jax.Array, key: jax.Array | None, rate: float,
                attention: str) -> jax.Array:  # fmt: skip
        logits = forward(params, images, key, rate, attention)
        one_hot = jax.nn.one_hot(labels, cfg["classes"], dtype=f32)
        return -(one_hot * jax.nn.log_softmax(logits)).sum(-1).mean()

    def make_step(rate: float, attention: str, forward_only: bool = False):
        lr, b1, b2, eps, wd, clip = 1e-3, 0.9, 0.999, 1e-8, 1e-4, 1.0

        def step(params: dict, mu: dict, nu: dict, count: jax.Array, images: jax.Array, labels: jax.Array,
                 key: jax.Array | None):  # fmt: skip
            k = None if key is None else jax.random.fold_in(key, count)
            if forward_only:
                return params, mu, nu, count + 1, loss_fn(params, images, labels, k, rate, attention)
            loss, grads = jax.value_and_grad(loss_fn)(params, images, labels, k, rate, attention)
            leaves = jax.tree_util.tree_leaves(grads)  # optax.clip_by_global_norm, then optax.adamw, all fp32
            norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in leaves))
            scale = jnp.minimum(1.0, clip / (norm + 1e-6))
            grads = jax.tree_util.tree_map(lambda g: g * scale, grads)
            c = count + 1
            mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, mu, grads)
            nu = jax.tree_util.tree_map(lambda n, g: b2 * n + (1 - b2) * g * g, nu, grads)
            bc1, bc2 = 1 - b1 ** c.astype(f32), 1 - b2 ** c.astype(f32)
            params = jax.tree_util.tree_map(
                lambda w, m, n: w - lr * ((m / bc1) / (jnp.sqrt(n / bc2) + eps) + wd * w), params, mu, nu
            )
            return params, mu, nu, c, loss

        return step

    # (name, batch, dropout rate, PRNG impl, attention, forward only, extra XLA compiler options)
    variants = [
        ("base: threefry dropout, materialised attention", 512, 0.1, "threefry2x32", "math", False, {}),
        ("no dropout", 512, 0.0, None, "math", False, {}),
        ("batch 256", 256, 0.1, "threefry2x32", "math", False, {}),
        ("unsafe_rbg dropout (T5X hardware RNG)", 512, 0.1, "unsafe_rbg", "math", False, {}),
        ("cuDNN fused attention (jax.nn.dot_product_attention)", 512, 0.1, "threefry2x32", "cudnn", False, {}),
        ("latency-hiding scheduler on", 512, 0.1, "threefry2x32", "math", False,
         {"xla_gpu_enable_latency_hiding_scheduler": True}),
        ("forward only", 512, 0.1, "threefry2x32", "math", True, {}),
    ]  # fmt: skip
    if tiny:
        variants = [(n, 4, r, i, a if a != "cudnn" else "xla-sdpa", fo, o) for n, _, r, i, a, fo, o in variants]
    reps = 3 if tiny else 10
    for name, batch, rate, impl, attention, forward_only, options in variants:
        elapsed = time.perf_counter() - t_start
        if elapsed > BUDGET_S:
            print(f"skipped (budget, {elapsed:.0f} s): {name}", flush=True)
            result["rows"].append({"variant": name, "skipped": f"budget {BUDGET_S:.0f} s reached at {elapsed:.0f} s"})
            continue
        row: dict = {"variant": name, "batch": batch, "dropout": rate, "prng_impl": impl, "attention": attention,
                     "forward_only": forward_only, "compiler_options": options}  # fmt: skip
        try:
            params = init_params(jax.random.PRNGKey(0))
            mu = jax.tree_util.tree_map(jnp.zeros_like, params)
            nu = jax.tree_util.tree_map(jnp.zeros_like, params)
            count = jnp.zeros((), jnp.int32)
            images = jax.random.normal(jax.random.PRNGKey(1), (batch, cfg["image"], cfg["image"], 3), f32)
            labels = jax.random.randint(jax.random.PRNGKey(2), (batch,), 0, cfg["classes"])
            key = jax.random.key(3, impl=impl) if impl else None
            fn = jax.jit(make_step(rate, attention, forward_only), donate_argnums=(0, 1, 2, 3))
            t0 = time.perf_counter()
            lowered = fn.lower(params, mu, nu, count, images, labels, key)
            compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
            row["compile_s"] = round(time.perf_counter() - t0, 2)
            try:
                cost = compiled.cost_analysis()
                cost = cost[0] if isinstance(cost, list) else cost
                row["xla_flops"] = float(cost.get("flops", float("nan")))
            except Exception:
                pass
            state = (params, mu, nu, count)
            for _ in range(3):  # warm-up
                *state, loss = compiled(*state, images, labels, key)
            loss.block_until_ready()
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                *state, loss = compiled(*state, images, labels, key)
                loss.block_until_ready()
                times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()  # back to back, one sync: what a pipelined loop sees
            for _ in range(reps):
                *state, loss = compiled(*state, images, labels, key)
            loss.block_until_ready()
            back_to_back = (time.perf_counter() - t0) / reps
            times.sort()
            row.update(step_ms_median=round(1e3 * times[len(times) // 2], 3), step_ms_min=round(1e3 * times[0], 3),
                       step_ms_back_to_back=round(1e3 * back_to_back, 3),
                       images_per_s=round(batch / back_to_back, 1), loss=float(loss))  # fmt: skip
            try:
                stats = devices[0].memory_stats() or {}
                row["peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
            except Exception:
                pass
            del state, params, mu, nu, compiled, lowered
        except Exception as exc:
            row["error"] = repr(exc)[:500]
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
        save()
    result["total_s"] = round(time.perf_counter() - t_start, 1)
    save()
    print(f"done in {result['total_s']} s -> {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
