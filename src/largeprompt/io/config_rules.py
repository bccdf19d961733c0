"""The constraints between config keys that a JSON schema cannot state (docs/reliability.md#config-fuzzing): each
broken one is one line naming both keys and what is allowed. Checked by :func:`largeprompt.io.config.check_config`
after the schema, before any job runs."""
from __future__ import annotations


def cross_key_errors(config: dict) -> list[str]:
    """Rules between keys that the schema cannot state."""
    lines = []
    affine = config.get("affine_limit", {})
    ray = affine.get("ray", {})
    if "direction" in ray and "gaussian_mean" in affine and len(ray["direction"]) != len(affine["gaussian_mean"]):
        lines.append(
            f"config key 'affine_limit.gaussian_mean' has {len(affine['gaussian_mean'])} entries but "
            f"'affine_limit.ray.direction' has {len(ray['direction'])}; both are the token dimension D and must match"
        )
    if "direction" in ray and not any(float(x) != 0.0 for x in ray["direction"]):
        lines.append("config key 'affine_limit.ray.direction' must not be the zero vector")
    for prefix in ("concentration", "fixed_query_bound"):
        node = config.get(prefix, {})
        lo, hi = node.get("log2_min_prompt_length"), node.get("log2_max_prompt_length")
        if lo is not None and hi is not None and hi < lo + 2:
            lines.append(
                f"config keys '{prefix}.log2_min_prompt_length' = {lo} and '{prefix}.log2_max_prompt_length' = {hi}: "
                f"the L grid needs log2_max_prompt_length ≥ log2_min_prompt_length + 2 to fit a rate"
            )
        block, reps = node.get("repetition_block"), node.get("n_repetitions")
        if block is not None and reps is not None and block > reps:
            lines.append(
                f"config key '{prefix}.repetition_block' = {block} exceeds '{prefix}.n_repetitions' = {reps}; "
                f"allowed: 1 ≤ repetition_block ≤ n_repetitions"
            )
    lines += _training_errors(config)
    return lines


def _step_size_errors(config: dict) -> list[str]:
    """The decay cap of the ``flow_sharpness`` step sizes (icl.schedules.Decay): it starts before it ends, and it lowers
    the step (the ``constant`` rule reads neither key)."""
    lines = []
    for section, node in (("train", config.get("train", {})),):
        if node.get("step_size_rule", "flow_sharpness") != "flow_sharpness":
            continue
        start, end = node.get("decay_start"), node.get("decay_end")
        if start is not None and end is not None and not start < end:
            lines.append(f"config keys '{section}.decay_start' = {start} and '{section}.decay_end' = {end}: the step decays "
                         f"from lr at decay_start·T to final_lr at decay_end·T (allowed: decay_start < decay_end)")
        lr, final = node.get("lr"), node.get("final_lr")
        if lr is not None and final is not None and final > lr:
            lines.append(f"config keys '{section}.final_lr' = {final} and '{section}.lr' = {lr}: the step would decay "
                         f"upwards (allowed: final_lr ≤ lr)")
    return lines


def _training_errors(config: dict) -> list[str]:
    lines = _step_size_errors(config)
    dep = config.get("init_dependence", {})
    if "n_folds" in dep and "n_seeds" in dep and dep["n_folds"] > dep["n_seeds"]:
        lines.append(f"config keys 'init_dependence.n_folds' = {dep['n_folds']} and 'init_dependence.n_seeds' = "
                     f"{dep['n_seeds']}: every fold needs a seed (allowed: n_folds ≤ n_seeds)")
    icl = config.get("icl", {})
    if icl.get("token_measure", "gaussian") != "gaussian" and icl.get("covariance_rho", 0.5) != 0:
        lines.append(f"config key 'icl.covariance_rho' = {icl.get('covariance_rho', 0.5)} with 'icl.token_measure' = "
                     f"{icl['token_measure']}: its covariates have i.i.d. unit-variance coordinates, Λ = I (allowed: "
                     f"covariance_rho: 0 with rademacher or uniform, any value in (-1, 1) with gaussian)")
    for section, node in (("train", config.get("train", {})), ("trajectory_transfer", config.get("trajectory_transfer", {})),
                          ("beyond_gaussian.train", config.get("beyond_gaussian", {}).get("train", {})),
                          ("beyond_gaussian.trajectory_transfer", config.get("beyond_gaussian", {}).get("trajectory_transfer", {}))):
        extra = sorted(set(node.get("replicate_seeds", [])) - set(node.get("seeds", [])))
        if "seeds" in node and extra:
            lines.append(f"config key '{section}.replicate_seeds' = {extra} names seeds that are not in "
                         f"'{section}.seeds' = {node['seeds']}; allowed: a subset of {section}.seeds")
    return lines
