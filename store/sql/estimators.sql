-- Estimators over one stored example, as DuckDB macros (pure functions of a row's
-- columns). Positions are 0-based indices into S (0..T-1); b is in nats.
-- List lambdas are DuckDB 2 syntax: `lambda x, i: ...` with i the 1-based index.
-- Every estimator reads list functions only: no window function, no unnest.

-- Degenerate example: its surprisal sum is below eps, so the shares pi_t = b_t / sum b
-- are undefined. Degenerate examples are counted and get NULL for every share-based
-- estimator below (and fall back to uniform weights in training, SPEC §3).
CREATE OR REPLACE MACRO is_degenerate(b_sum, eps) AS b_sum < eps;

-- t0 by cumulative share: the first position t where the running sum of b reaches a
-- share q of the example's total,  t0_share = min { t : cumsum_b[t] >= q * b_sum }.
-- Reads the stored running sum `cumsum_b`, so it is a list query. NULL for a degenerate
-- example. If float32 rounding of the stored running sum leaves every position just
-- below q * b_sum (possible only for q close to 1), the answer is the last position T - 1.
CREATE OR REPLACE MACRO t0_share(cumsum_b, b_sum, q, eps) AS
    CASE WHEN b_sum < eps THEN NULL
         ELSE coalesce(list_position(list_transform(cumsum_b, lambda c: c >= q * b_sum), true) - 1,
                       len(cumsum_b) - 1)
    END;

-- t0 by threshold: the last position whose surprisal exceeds tau nats,
-- t0_threshold = max { t : b[t] > tau }. NULL when no position exceeds tau (an
-- all-below example; the report counts them).
CREATE OR REPLACE MACRO t0_threshold(b, tau) AS
    list_max(list_transform(b, lambda x, i: CASE WHEN x > tau THEN i END)) - 1;

-- Dilution: the share of S that carries the strategy. Positions 0..t0 are informative,
-- so that is t0 + 1 tokens out of T:  dilution = (t0 + 1) / T.
CREATE OR REPLACE MACRO dilution(t0, T) AS (t0 + 1) / T;

-- Predicted amplification of the posterior gradient by surprisal-share weighting over a
-- uniform token mean (SPEC §1): the inverse of the dilution,  T / (t0 + 1).
CREATE OR REPLACE MACRO amplification(t0, T) AS T / (t0 + 1);

-- Weight concentration over pi_t = b_t / sum b (NULL for a degenerate example).
-- Entropy of pi in nats, H = -sum_t pi_t ln pi_t (0 ln 0 = 0): ln T for uniform weights,
-- 0 when one token carries everything.
CREATE OR REPLACE MACRO share_entropy(b, b_sum, eps) AS
    CASE WHEN b_sum < eps THEN NULL
         ELSE -list_sum(list_transform(b, lambda x: CASE WHEN x > 0 THEN x / b_sum * ln(x / b_sum) ELSE 0 END))
    END;

-- Effective number of tokens, 1 / sum_t pi_t^2 = (sum b)^2 / sum b^2: T for uniform
-- weights, 1 when one token carries everything.
CREATE OR REPLACE MACRO effective_tokens(b, b_sum, eps) AS
    CASE WHEN b_sum < eps THEN NULL
         ELSE b_sum * b_sum / list_sum(list_transform(b, lambda x: x::DOUBLE * x))
    END;

-- Largest share, max_t pi_t.
CREATE OR REPLACE MACRO max_share(b, b_sum, eps) AS
    CASE WHEN b_sum < eps THEN NULL ELSE list_max(b) / b_sum END;
