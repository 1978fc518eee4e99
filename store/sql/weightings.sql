-- The reconstruction weightings of training/objective/terms.py as DuckDB macros over one stored example,
-- for what the store can say about them before any training.
--
-- z_gain_<weighting>: the weighted reconstruction R = sum_t pi_t l_t that a z removing all of the
-- base model's surprisal (l_t(z) = 0 wherever b_t > 0) saves on one example, sum_t pi_t b_t nats,
-- read off the stored per-example scalars (no list is read):
--   uniform          pi_t = 1 / T        ->  sum b / T
--   sum              pi_t = 1            ->  sum b
--   surprisal-share  pi_t = b_t / sum b  ->  sum b^2 / sum b (b_sq_sum / b_sum); a degenerate example
--                    falls back to uniform weights, as in training (which also adds eps to sum b).
CREATE OR REPLACE MACRO z_gain_uniform(b_sum, T) AS b_sum / T;

CREATE OR REPLACE MACRO z_gain_sum(b_sum) AS b_sum;

CREATE OR REPLACE MACRO z_gain_surprisal_share(b_sum, b_sq_sum, T, degenerate) AS
    CASE WHEN degenerate THEN z_gain_uniform(b_sum, T) ELSE b_sq_sum / b_sum END;
