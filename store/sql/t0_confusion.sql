-- Ground-truth t0 against both estimates: how many examples have each
-- (t0, t0_share, t0_threshold) triple, per fingerprint (examples with a ground truth).
SELECT fingerprint, t0, t0_share, t0_threshold, count(*) AS n
FROM examples
WHERE t0 IS NOT NULL
GROUP BY ALL
ORDER BY ALL;
