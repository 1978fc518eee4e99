-- Estimators over one stored example, as DuckDB macros (pure functions of a row's
-- columns). Positions are 0-based indices into S (0..T-1); b is in nats.
-- List lambdas are DuckDB 2 syntax: `lambda x, i: ...` with i the 1-based index.
-- Every estimator reads list functions or stored per-example scalars only: no window
-- function, no unnest; at the default parameters, stored scalars only. b >= 0: it is -log p, computed as logsumexp minus the target logit,
-- which cannot be negative.

-- Degenerate example: its surprisal sum is below eps, so the shares pi_t = b_t / sum b
-- are undefined. Degenerate examples are counted and get NULL for every share-based
-- estimator below (and fall back to uniform weights in training, docs/contract.md §3).
CREATE OR REPLACE MACRO is_degenerate(b_sum, eps) AS b_sum < eps;

-- t0 by cumulative share: the first position t where the running sum of b reaches a
-- share q of the example's total,  t0_share = min { t : cumsum_b[t] >= q * b_sum }.
-- Reads the stored running sum `cumsum_b`, so it is a list query (list_position is
-- 1-based, hence the - 1). NULL for a degenerate example. If float32 rounding of the
-- stored running sum leaves every position just below q * b_sum (possible only for q
-- close to 1), the answer is the last position T - 1.
CREATE OR REPLACE MACRO t0_share(cumsum_b, b_sum, q, eps) AS
    CASE WHEN b_sum < eps THEN NULL
         ELSE coalesce(list_position(list_transform(cumsum_b, lambda c: c >= q * b_sum), true), len(cumsum_b)) - 1
    END;

-- t0_share as the `examples` view reads it: the value stored at extraction (store/derived.py,
-- at q = stored_q and eps = stored_eps) where the parameters are those, else computed from the
-- lists. The variables are constants when a query is planned, so DuckDB drops the branch not
-- taken, and with it the list that only that branch reads.
CREATE OR REPLACE MACRO t0_share_at(stored, cumsum_b, b_sum, q, eps) AS
    CASE WHEN q = getvariable('stored_q') AND eps = getvariable('stored_eps') THEN stored
         ELSE t0_share(cumsum_b, b_sum, q, eps) END;

-- t0 by threshold: the last position whose surprisal exceeds tau nats,
-- t0_threshold = max { t : b[t] > tau }, found as the first hit from the end. NULL when
-- no position exceeds tau (an all-below example; the report counts them).
CREATE OR REPLACE MACRO t0_threshold(b, tau) AS
    len(b) - list_position(list_reverse(list_transform(b, lambda x: x > tau)), true);

-- t0_threshold as the `examples` view reads it: stored at tau = stored_tau, else from b.
CREATE OR REPLACE MACRO t0_threshold_at(stored, b, tau) AS
    CASE WHEN tau = getvariable('stored_tau') THEN stored ELSE t0_threshold(b, tau) END;

-- Dilution: the share of S that carries the strategy. Positions 0..t0 are informative,
-- so that is t0 + 1 tokens out of T:  dilution = (t0 + 1) / T.
CREATE OR REPLACE MACRO dilution(t0, T) AS (t0 + 1) / T;

-- Predicted amplification of the posterior gradient by surprisal-share weighting over a
-- uniform token mean (docs/contract.md §1): the inverse of the dilution,  T / (t0 + 1).
CREATE OR REPLACE MACRO amplification(t0, T) AS T / (t0 + 1);

-- Weight concentration over pi_t = b_t / sum b (NULL for a degenerate example). Each one
-- reads per-example scalars that extraction computes from b in float64 (store/derived.py),
-- so no per-token arithmetic happens here. The list forms they equal, the reference
-- definitions (tests/test_sql.py evaluates these lines and checks both against numpy):
-- reference share_entropy    = ln(b_sum) - list_sum(list_transform(b, lambda x: CASE WHEN x > 0 THEN x * ln(x) ELSE 0 END)) / b_sum
-- reference effective_tokens = b_sum * b_sum / list_dot_product(b::DOUBLE[], b::DOUBLE[])
-- reference max_share        = list_max(b) / b_sum

-- Entropy of pi in nats, H = -sum_t pi_t ln pi_t (0 ln 0 = 0): ln T for uniform weights,
-- 0 when one token carries everything. With sum_t b_t ln b_t stored as b_xlogx_sum,
-- H = ln(sum b) - b_xlogx_sum / sum b.
CREATE OR REPLACE MACRO share_entropy(b_sum, b_xlogx_sum, eps) AS
    CASE WHEN b_sum < eps THEN NULL ELSE ln(b_sum) - b_xlogx_sum / b_sum END;

-- Effective number of tokens, 1 / sum_t pi_t^2 = (sum b)^2 / sum b^2: T for uniform
-- weights, 1 when one token carries everything. sum b^2 is stored as b_sq_sum.
CREATE OR REPLACE MACRO effective_tokens(b_sum, b_sq_sum, eps) AS
    CASE WHEN b_sum < eps THEN NULL ELSE b_sum * b_sum / b_sq_sum END;

-- Largest share, max_t pi_t = max_t b_t / sum b, with max_t b_t stored as b_max.
CREATE OR REPLACE MACRO max_share(b_max, b_sum, eps) AS
    CASE WHEN b_sum < eps THEN NULL ELSE b_max / b_sum END;
