"""The factored AugFL round against the materialised one, timed in turn.

  python -m benchmarks.factored_round 40 map   # C clients, client strategy
"""
import sys, time, statistics, os, jax, jax.numpy as jnp
from benchmarks import cells
from augfl_jax.algorithms.augfl import round as augfl, factored
C = int(sys.argv[1]) if len(sys.argv) > 1 else 40
strategy = sys.argv[2] if len(sys.argv) > 2 else "map"
p = cells.make_problem("cnn", "patches", C, 15)
cfg = augfl.AugFLConfig()
rm = augfl.make_round(p.loss_fn, cfg, strategy); rf = factored.make_round(p.loss_fn, cfg, strategy)
sm = augfl.init_state(p.params, C); sf = factored.init_state(p.loss_fn, p.params, p.clients)
t0 = time.perf_counter(); sm, _ = rm(sm, p.clients); jax.block_until_ready(sm); print("compile+1 materialised", time.perf_counter() - t0)
t0 = time.perf_counter(); sf, _ = rf(sf, p.clients); jax.block_until_ready(sf); print("compile+1 factored", time.perf_counter() - t0)
tm, tf = [], []
for _ in range(int(os.environ.get("REPEATS", 6))):
  t0 = time.perf_counter(); sm, _ = rm(sm, p.clients); jax.block_until_ready(sm); tm.append(time.perf_counter() - t0)
  t0 = time.perf_counter(); sf, _ = rf(sf, p.clients); jax.block_until_ready(sf); tf.append(time.perf_counter() - t0)
print(f"C={C} {strategy}: materialised median {statistics.median(tm):.3f} s (min {min(tm):.3f}), factored median {statistics.median(tf):.3f} s (min {min(tf):.3f}), ratio {statistics.median(tm)/statistics.median(tf):.2f}")
print("load", os.getloadavg())
rel = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(a))) for a, b in zip(jax.tree.leaves(sm.params), jax.tree.leaves(sf.params)))
print("f32 rel diff after", 1 + len(tm), "rounds", rel)
