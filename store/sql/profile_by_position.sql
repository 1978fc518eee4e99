-- Surprisal profile: mean and quantiles (10%, 50%, 90%, linear interpolation) of b
-- (nats) at each 0-based position of S, per fingerprint, over all examples long enough
-- to have that position (n says how many).
SELECT fingerprint, pos, count(*) AS n, avg(b) AS mean_b,
       quantile_cont(b, 0.1) AS q10_b, quantile_cont(b, 0.5) AS median_b, quantile_cont(b, 0.9) AS q90_b,
       avg(pi) AS mean_pi
FROM tokens
GROUP BY fingerprint, pos
ORDER BY fingerprint, pos;
