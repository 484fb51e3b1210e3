"""Plant one realistic bug at a time in a scratch copy of the repository and run the suite on it.

    python scripts/mutation_check.py REPO_DIR PYTHON [NAME ...]     # -> mutation_results.jsonl (appended)
    python scripts/mutation_check.py --table mutation_results.jsonl # the markdown table of docs/testing.md

Each mutation is an exact text replacement that must match once (a SKIP line says when the code moved).
The likely tests run first (``-x``); the whole suite runs only when they all pass, so a mutation that
survives costs one full suite. A mutation is caught when pytest fails; the first failing test is recorded.
"""
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

M = [
    # (name, quantity, file, old, new)
    ("w_i without c_i^2", "w_i", "src/oblr/update.py",
     "book.sq_norms() * c.pow(2)", "book.sq_norms() * c"),
    ("advantage sign flipped in the update", "gradient", "src/oblr/update.py",
     "coeffs = -est.advantages.reshape(-1)", "coeffs = est.advantages.reshape(-1)"),
    ("g_k scaled by N instead of N^2", "S, V", "src/oblr/update.py",
     "* (n_total * n_total))", "* n_total)"),
    ("rows mapped to the wrong prompt in g_k", "per-prompt ||g_k||^2", "src/oblr/update.py",
     "torch.arange(k1 - k0, device=coeffs.device).repeat_interleave(G)",
     "torch.arange(k1 - k0, device=coeffs.device).repeat(G)"),
    ("KL term without c_i", "KL / loss", "src/oblr/update.py",
     "obj = obj + settings.kl_coef * c_mb * kl", "obj = obj + settings.kl_coef * kl"),
    ("entropy as a sum, not a token mean", "entropy", "src/oblr/update.py",
     'metrics["train/entropy"] = ent_sum / n_tok', 'metrics["train/entropy"] = ent_sum'),
    ("V divides by N instead of N-1", "V", "src/oblr/snr.py",
     "V = (total - n_prompts * mean_sq) / (n_prompts - 1)", "V = (total - n_prompts * mean_sq) / n_prompts"),
    ("signal without the -V/N correction", "S", "src/oblr/snr.py",
     "return _stats(mean_sq - V / n_prompts, V, int(n_prompts))", "return _stats(mean_sq, V, int(n_prompts))"),
    ("factor S/(S+V) instead of S/(S+V/N)", "lr factor", "src/oblr/snr.py",
     "den = S + V / n", "den = S + V"),
    ("EMA without bias correction", "lr factor (EMA)", "src/oblr/snr.py",
     "corr = 1.0 - b**self.steps", "corr = 1.0"),
    ("EMA of S not checkpointed", "lr controller state", "src/oblr/snr.py",
     '"_s_avg", "_v_avg",', '"_v_avg",'),
    ("leave-one-out includes the sample itself", "baseline", "src/oblr/estimators.py",
     "off = 1.0 - torch.eye(g, dtype=x.dtype, device=x.device)", "off = torch.ones(g, g, dtype=x.dtype, device=x.device)"),
    ("seq_sum_const factor without 1/B", "c_i", "src/oblr/losses.py",
     "1.0 / (totals.sequences * width)", "1.0 / width"),
    ("padding counted in a sequence's log-prob", "l_i", "src/oblr/logprobs.py",
     "return (token_lp * response_mask.to(token_lp.dtype)).sum(-1)", "return token_lp.sum(-1)"),
    ("lr set after the optimizer step (one step late)", "learning rate applied", "src/oblr/train/trainer.py",
     "            self.lr_ctrl.step(res.snr)\n            if cfg.optim.grad_clip > 0:\n                clip_grads_(params, cfg.optim.grad_clip, grad_sq)\n            self.optimizer.step()\n",
     "            if cfg.optim.grad_clip > 0:\n                clip_grads_(params, cfg.optim.grad_clip, grad_sq)\n            self.optimizer.step()\n            self.lr_ctrl.step(res.snr)\n"),
    ("grad norm logged squared", "gradient norm", "src/oblr/train/trainer.py",
     'metrics["optim/grad_norm"] = grad_sq.sqrt()', 'metrics["optim/grad_norm"] = grad_sq'),
    ("pass rate counts any positive reward", "pass rate", "src/oblr/train/trainer.py",
     '"train/pass_rate": (rewards >= 1.0 - 1e-6).float().mean()', '"train/pass_rate": (rewards > 0).float().mean()'),
    ("all-equal share inverted", "share of groups with equal rewards", "src/oblr/train/trainer.py",
     '(rewards.max(1).values == rewards.min(1).values).float().mean()',
     '(rewards.max(1).values != rewards.min(1).values).float().mean()'),
    ("micro-batch uses its own c_i", "micro-batch gradient", "src/oblr/update.py",
     "r_mb, rm_mb, c_mb = rewards[k0:k1], rmf[rows], scale[rows]",
     "r_mb, rm_mb, c_mb = rewards[k0:k1], rmf[rows], sequence_scale(rmf[rows], settings.aggregation, max_len=settings.max_len)"),
    ("optimizer state not restored on resume", "checkpointed optimizer state", "src/oblr/train/trainer.py",
     'state = {"optimizer": self.optimizer.state_dict(),', 'state = {"optimizer": type(self.optimizer)(self.model.parameters(), lr=1.0).state_dict(),'),
]

FIRST = ["tests/core", "tests/train/test_train_signal.py", "tests/train/test_training_variants.py", "tests/gradnorm"]


def table(path: str) -> str:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    out = ["| planted bug | quantity | caught by (first failing test) |", "|---|---|---|"]
    for r in rows:
        by = f"`{r['by'][0]}`" if r["by"] else ("caught (no test name)" if r["caught"] else "**NOT caught**")
        out.append(f"| {r['name']} (`{r['file']}`) | {r['quantity']} | {by} |")
    return "\n".join(out)


def main():
    if sys.argv[1] == "--table":
        print(table(sys.argv[2]))
        return
    repo, py = Path(sys.argv[1]), sys.argv[2]
    only = set(sys.argv[3:])
    out = Path.cwd() / "mutation_results.jsonl"
    for name, qty, rel, old, new in M:
        if only and name not in only:
            continue
        work = Path("/tmp/mut-work")
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(repo, work, ignore=shutil.ignore_patterns(".venv*", ".git", "runs", "__pycache__", ".whl"))
        f = work / rel
        text = f.read_text()
        if text.count(old) != 1:
            print(f"SKIP {name}: pattern found {text.count(old)} times in {rel}", flush=True)
            continue
        f.write_text(text.replace(old, new))
        first = [p for p in FIRST if (work / p).exists()]
        t0 = time.time()
        env = {"PYTHONPATH": str(work / "src"), "PATH": "/usr/bin:/bin", "HOME": "/root", "OMP_NUM_THREADS": "1",
               "OBLR_DATA_DIR": "/work/shared/data"}
        r = None
        for targets in (first, ["tests"]):  # the likely tests first; the whole suite only if they pass
            r = subprocess.run([py, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-W", "ignore", *targets],
                               cwd=work, capture_output=True, text=True, env=env)
            if r.returncode != 0:
                break
        caught = [ln.split(" ")[1] for ln in r.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
        rec = {"name": name, "quantity": qty, "file": rel, "caught": bool(caught) or r.returncode != 0,
               "by": caught[:1], "rc": r.returncode, "seconds": round(time.time() - t0)}
        if r.returncode == 0:
            rec["by"] = []
        print(json.dumps(rec), flush=True)
        with open(out, "a") as fh:
            fh.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
