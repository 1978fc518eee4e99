-- Surprisal profile: mean and quantiles (10%, 50%, 90%, linear interpolation) of b
-- (nats) at each 0-based position of S, per fingerprint, over all examples long enough
-- to have that position (n says how many). The quantiles are one aggregate over the list
-- of fractions (one sort per group instead of three), over the n_quantile tokens of the
-- examples in the quantile sample: all of them up to quantile_tokens tokens in the store,
-- where they are exact (views.sql, `tokens`, gives the sample and its error).
SELECT fingerprint, pos, n, mean_b, q[1] AS q10_b, q[2] AS median_b, q[3] AS q90_b, mean_pi, n_quantile
FROM (SELECT fingerprint, pos, count(*) AS n, avg(b) AS mean_b,
             quantile_cont(b, [0.1, 0.5, 0.9]) FILTER (in_quantile_sample) AS q, avg(pi) AS mean_pi,
             count(*) FILTER (in_quantile_sample) AS n_quantile
      FROM tokens
      GROUP BY fingerprint, pos)
ORDER BY fingerprint, pos;
