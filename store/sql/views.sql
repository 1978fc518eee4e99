-- The documented views. `store_rows` (one row per stored example: `fingerprint` as text
-- plus the columns of store/schema.py PART_SCHEMA, read from manifest-listed parts only)
-- and the variables q, tau, eps are set up by store/sql.py before this file runs.

-- examples: one row per example, every stored column plus the per-example diagnostics
-- of estimators.sql at the connection's q (cumulative share), tau (nats) and eps; the
-- stored t0_share and t0_threshold (at the default parameters) are replaced by those.
-- `t0` and `strategy` are the ground truth passed through from the sample (may be NULL);
-- `dilution`/`amplification` use t0_share, `amplification_true` the ground-truth t0.
CREATE OR REPLACE VIEW examples AS
SELECT *,  -- the t0 estimate is computed once below, then reused (an alias would be re-evaluated)
       dilution(t0_share, T) AS dilution,
       amplification(t0_share, T) AS amplification,
       amplification(t0, T) AS amplification_true
FROM (SELECT * EXCLUDE (t0_share, t0_threshold),
             b_sum / T AS mean_b,
             is_degenerate(b_sum, getvariable('eps')) AS degenerate,
             t0_share_at(t0_share, cumsum_b, b_sum, getvariable('q'), getvariable('eps')) AS t0_share,
             t0_threshold_at(t0_threshold, b, getvariable('tau')) AS t0_threshold,
             share_entropy(b_sum, b_xlogx_sum, getvariable('eps')) AS share_entropy,
             effective_tokens(b_sum, b_sq_sum, getvariable('eps')) AS effective_tokens,
             max_share(b_max, b_sum, getvariable('eps')) AS max_share
      FROM store_rows);

-- symbols: fingerprint -> its vocabulary as a list (token id i at index i + 1), so that
-- `symbol` is a list look-up that DuckDB drops when a query does not ask for it (a join
-- with `vocab` would run on every token of every query over `tokens`).
SET VARIABLE symbols = (SELECT map_from_entries(list((fingerprint, tokens)))
                        FROM (SELECT fingerprint, list(token ORDER BY id) AS tokens FROM vocab GROUP BY fingerprint));

-- The vocabulary's name for token_id in fingerprint's vocabulary; NULL for an id outside it.
CREATE OR REPLACE MACRO symbol_of(fingerprint, token_id) AS
    CASE WHEN token_id >= 0 THEN getvariable('symbols')[fingerprint][token_id + 1] END;

-- The connected fingerprints, sorted: fingerprint_index(fingerprint) is a fingerprint's
-- 1-based place in this list, a small integer to group by where grouping every token by
-- the fingerprint's text would cost (profile_by_position.sql).
SET VARIABLE fingerprints = (SELECT list(fingerprint ORDER BY fingerprint) FROM manifests);

CREATE OR REPLACE MACRO fingerprint_index(fingerprint) AS list_position(getvariable('fingerprints'), fingerprint);

-- The denominator of pi = b / sum b: sum b, or NULL for a degenerate example (pi NULL).
CREATE OR REPLACE MACRO share_denominator(b_sum) AS
    CASE WHEN is_degenerate(b_sum, getvariable('eps')) THEN NULL ELSE b_sum END;

-- The quantile sample: whether an example's tokens enter the quantiles of the
-- per-position profile (profile_by_position.sql). Exact quantiles over every token cost
-- about 4x a plain scan of b, nearly all of it in DuckDB's quantile aggregate
-- (approx_quantile's t-digest and reservoir_quantile measured slower still on 10M
-- tokens), so above `quantile_tokens` tokens (a variable that store/sql.py sets; NULL:
-- no limit) they are taken over the examples whose key hashes into the first
-- `quantile_share` of the hash space, about quantile_tokens tokens in all. The sample is
-- deterministic (the same store and DuckDB version give the same rows) and, in a smaller
-- store, every example: the quantiles are then exact. Counts and means always read every
-- token. A quantile p over the m = n_quantile sampled values of a group is the exact
-- quantile of a simple random sample of its examples: its rank among all n values of the
-- group is within about +-2 sqrt(p (1 - p) / m) of p (95%).
SET VARIABLE quantile_share = (SELECT coalesce(least(1.0, getvariable('quantile_tokens') / sum(tokens)), 1.0)
                               FROM manifests);

CREATE OR REPLACE MACRO in_quantile_sample(key) AS
    getvariable('quantile_share') >= 1.0 OR hash(key) % 1048576 < getvariable('quantile_share') * 1048576;

-- tokens: one row per supervised token. `pos` is the 0-based position in S, `token_id`
-- and `symbol` the target token, `entropy` the base model's predictive entropy (nats),
-- `top1` whether the target was its argmax, `pi` = b / sum b (NULL when degenerate),
-- `in_quantile_sample` whether the example is in the quantile sample (above).
-- Only b is unnested; the other per-token columns are picked out of their lists by
-- position, so a query reads and expands only the lists it names (DuckDB keeps every
-- unnest of a SELECT, used or not, but drops unused projections). What depends on the
-- example alone is computed once per example, before the unnest.
CREATE OR REPLACE VIEW tokens AS
SELECT fingerprint, shard, key, T, strategy, t0, pos, b,
       target_id[pos + 1] AS token_id, symbol_of(fingerprint, target_id[pos + 1]) AS symbol,
       entropy[pos + 1] AS entropy, top1[pos + 1] AS top1, cumsum_b[pos + 1] AS cumsum_b,
       b / denominator AS pi, in_quantile_sample
FROM (SELECT * EXCLUDE (b), unnest(range(T)) AS pos, unnest(b) AS b
      FROM (SELECT *, share_denominator(b_sum) AS denominator, in_quantile_sample(key) AS in_quantile_sample
            FROM store_rows));
