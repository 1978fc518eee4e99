-- Headline numbers per fingerprint, over the `examples` view.
-- t0 accuracy compares an estimate with the ground-truth t0 on examples that have both:
-- exact-match rate = mean(estimate = t0), MAE = mean |estimate - t0| (positions),
-- within-1 rate = mean(|estimate - t0| <= 1). Degenerate examples (sum b < eps) are
-- counted and have no t0_share and no weight-concentration values; examples with no
-- position above tau are counted as t0_threshold_none.
SELECT fingerprint,
       count(*) AS examples,
       sum(T)::BIGINT AS tokens,
       sum(b_sum) / sum(T) AS mean_b,
       avg(mean_b) AS mean_example_mean_b,
       count(*) FILTER (degenerate) AS degenerate,
       count(*) FILTER (t0_threshold IS NULL) AS t0_threshold_none,
       count(t0) AS with_true_t0,
       count(*) FILTER (t0 IS NOT NULL AND t0_share IS NOT NULL) AS t0_share_compared,
       avg((t0_share = t0)::INT) AS t0_share_exact,
       avg(abs(t0_share - t0)) AS t0_share_mae,
       avg((abs(t0_share - t0) <= 1)::INT) AS t0_share_within_1,
       count(*) FILTER (t0 IS NOT NULL AND t0_threshold IS NOT NULL) AS t0_threshold_compared,
       avg((t0_threshold = t0)::INT) AS t0_threshold_exact,
       avg(abs(t0_threshold - t0)) AS t0_threshold_mae,
       avg((abs(t0_threshold - t0) <= 1)::INT) AS t0_threshold_within_1,
       avg(T) AS mean_T,
       avg(dilution) AS mean_dilution,
       avg(amplification) AS mean_amplification,
       median(amplification) AS median_amplification,
       avg(amplification_true) AS mean_amplification_true,
       median(amplification_true) AS median_amplification_true,
       avg(share_entropy) AS mean_share_entropy,
       avg(effective_tokens) AS mean_effective_tokens,
       avg(effective_tokens / T) AS mean_effective_fraction,
       avg(max_share) AS mean_max_share,
       avg(b_sq_sum / b_sum) FILTER (NOT degenerate) / avg(b_sum / T) FILTER (NOT degenerate)
           AS gain_ratio_if_z_removes_b
FROM examples
GROUP BY fingerprint
ORDER BY fingerprint;
