-- The beta below which a z that removes all of the base model's surprisal pays for itself, per
-- fingerprint and weighting: the reconstruction it gains per example (weightings.sql, averaged over
-- the examples) over the KL it costs, I(z; y | x) = H(strategy) nats for a z that names the strategy
-- (x does not tell it on a synthetic task); the survival sweep found the gains follow this, not
-- T/(t0+1). Cost and beta_c are NULL where no example carries a strategy label.
WITH labelled AS (
    SELECT fingerprint, strategy, count(*) AS n FROM examples WHERE strategy IS NOT NULL GROUP BY ALL),
cost AS (
    SELECT fingerprint, -sum(n / total * ln(n / total)) AS kl_cost
    FROM (SELECT *, sum(n) OVER (PARTITION BY fingerprint) AS total FROM labelled) GROUP BY fingerprint),
gain AS (
    SELECT fingerprint, avg(z_gain_uniform(b_sum, T)) AS uniform, avg(z_gain_sum(b_sum)) AS "sum",
           avg(z_gain_surprisal_share(b_sum, b_sq_sum, T, degenerate)) AS "surprisal-share"
    FROM examples GROUP BY fingerprint)
SELECT fingerprint, weighting, gain_nats, kl_cost AS kl_cost_nats, gain_nats / kl_cost AS beta_c_predicted
FROM (UNPIVOT gain ON uniform, "sum", "surprisal-share" INTO NAME weighting VALUE gain_nats)
LEFT JOIN cost USING (fingerprint)
ORDER BY fingerprint, list_position(['uniform', 'sum', 'surprisal-share'], weighting)
