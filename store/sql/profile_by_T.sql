-- Surprisal profile per length: mean and median b (nats) at each 0-based position of S,
-- per fingerprint and T = |S|.
SELECT fingerprint, T, pos, count(*) AS n, avg(b) AS mean_b, quantile_cont(b, 0.5) AS median_b
FROM tokens
GROUP BY fingerprint, T, pos
ORDER BY fingerprint, T, pos;
