-- Surprisal profile per ground-truth strategy: mean and median b (nats) at each 0-based
-- position of S, per fingerprint and strategy (NULL strategy: not recorded).
SELECT fingerprint, strategy, pos, count(*) AS n, avg(b) AS mean_b, quantile_cont(b, 0.5) AS median_b
FROM tokens
GROUP BY fingerprint, strategy, pos
ORDER BY fingerprint, strategy, pos;
