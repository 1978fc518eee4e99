-- Surprisal profile: mean and quantiles (10%, 50%, 90%, linear interpolation) of b
-- (nats) at each 0-based position of S, per fingerprint, over all examples long enough
-- to have that position (n says how many). The quantiles are one aggregate over the list
-- of fractions (one sort per group instead of three), over the n_quantile tokens of the
-- examples in the quantile sample: all of them up to quantile_tokens tokens in the store,
-- where they are exact (views.sql gives the sample and its error).
-- This reads store_rows rather than `tokens` (the same b, pi and sample, through the same
-- macros) so as to group by fingerprint_index, computed once per example: grouping every
-- token by the fingerprint's text measured about half a scan of b more.
SELECT getvariable('fingerprints')[fp] AS fingerprint, pos, n, mean_b,
       q[1] AS q10_b, q[2] AS median_b, q[3] AS q90_b, mean_pi, n_quantile
FROM (SELECT fp, pos, count(*) AS n, avg(b) AS mean_b,
             quantile_cont(b, [0.1, 0.5, 0.9]) FILTER (in_sample) AS q, avg(b / denominator) AS mean_pi,
             count(*) FILTER (in_sample) AS n_quantile
      FROM (SELECT fp, denominator, in_sample, unnest(range(T)) AS pos, unnest(b) AS b
            FROM (SELECT fingerprint_index(fingerprint) AS fp, T, b, share_denominator(b_sum) AS denominator,
                         in_quantile_sample(key) AS in_sample
                  FROM store_rows))
      GROUP BY fp, pos)
ORDER BY fingerprint, pos;
