-- The documented views. `store_rows` (one row per stored example: `fingerprint` as text
-- plus the columns of store/schema.py PART_SCHEMA, read from manifest-listed parts only)
-- and the variables q, tau, eps are set up by store/sql.py before this file runs.

-- examples: one row per example, every stored column plus the per-example diagnostics
-- of estimators.sql at the connection's q (cumulative share), tau (nats) and eps.
-- `t0` and `strategy` are the ground truth passed through from the sample (may be NULL);
-- `dilution`/`amplification` use t0_share, `amplification_true` the ground-truth t0.
CREATE OR REPLACE VIEW examples AS
SELECT *,  -- the t0 estimate is computed once below, then reused (an alias would be re-evaluated)
       dilution(t0_share, T) AS dilution,
       amplification(t0_share, T) AS amplification,
       amplification(t0, T) AS amplification_true
FROM (SELECT *,
             b_sum / T AS mean_b,
             is_degenerate(b_sum, getvariable('eps')) AS degenerate,
             t0_share(cumsum_b, b_sum, getvariable('q'), getvariable('eps')) AS t0_share,
             t0_threshold(b, getvariable('tau')) AS t0_threshold,
             share_entropy(b_sum, b_xlogx_sum, getvariable('eps')) AS share_entropy,
             effective_tokens(b_sum, b_sq_sum, getvariable('eps')) AS effective_tokens,
             max_share(b_max, b_sum, getvariable('eps')) AS max_share
      FROM store_rows);

-- tokens: one row per supervised token. `pos` is the 0-based position in S, `token_id`
-- and `symbol` the target token, `entropy` the base model's predictive entropy (nats),
-- `top1` whether the target was its argmax, `pi` = b / sum b (NULL when degenerate).
CREATE OR REPLACE VIEW tokens AS
SELECT t.fingerprint, t.shard, t.key, t.T, t.strategy, t.t0, t.pos, t.b,
       t.token_id, v.token AS symbol, t.entropy, t.top1, t.cumsum_b,
       CASE WHEN is_degenerate(t.b_sum, getvariable('eps')) THEN NULL ELSE t.b / t.b_sum END AS pi
FROM (SELECT fingerprint, shard, key, T, strategy, t0, b_sum,
             unnest(range(T)) AS pos, unnest(b) AS b, unnest(target_id) AS token_id,
             unnest(entropy) AS entropy, unnest(top1) AS top1, unnest(cumsum_b) AS cumsum_b
      FROM store_rows) AS t
LEFT JOIN vocab AS v ON v.fingerprint = t.fingerprint AND v.id = t.token_id;
