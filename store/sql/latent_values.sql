-- latent_values: which latent values to trust, from the posteriors' labels (`tokweight sql STORE --run RUN`).
-- One row per split and latent value: its examples, how many carry a strategy label, the labels' shares (most
-- common first), the most common label and its share, and the status by the rule of eval.md's "Which latent
-- values to trust" ($one_strategy: training.evaluation.verdict.ONE_STRATEGY).
CREATE VIEW latent_values AS
WITH counts AS (
    SELECT split, latent, strategy, count(*) AS n FROM posteriors GROUP BY ALL
), ranked AS (
    SELECT split, latent, strategy, n,
           n / sum(n) FILTER (WHERE strategy IS NOT NULL) OVER (PARTITION BY split, latent) AS share,
           row_number() OVER (PARTITION BY split, latent ORDER BY (strategy IS NULL), n DESC, strategy) AS rank
    FROM counts
)
SELECT split, latent,
       sum(n)::BIGINT AS examples,
       coalesce(sum(n) FILTER (WHERE strategy IS NOT NULL), 0)::BIGINT AS labelled,
       list(struct_pack(strategy := strategy, share := round(share, 4)) ORDER BY rank)
           FILTER (WHERE strategy IS NOT NULL) AS labels,
       max(strategy) FILTER (WHERE rank = 1 AND strategy IS NOT NULL) AS strategy,
       max(share) FILTER (WHERE rank = 1 AND strategy IS NOT NULL) AS share,
       CASE WHEN count(strategy) = 0 THEN 'no labels'
            WHEN max(share) FILTER (WHERE rank = 1) >= $one_strategy THEN 'one strategy'
            WHEN coalesce(max(share) FILTER (WHERE rank = 2), 0) >= 1 - $one_strategy THEN 'merge'
            ELSE 'unreliable' END AS status
FROM ranked GROUP BY split, latent ORDER BY split, latent;
