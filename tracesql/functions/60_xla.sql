-- XLA: what an op's framework path says about it (JAX writes the op's named scopes and transformations into
-- the HLO metadata's op_name: 'jit(train_step)/transpose(jvp(mlp))/up/dot_general').

-- The pass an XLA op belongs to, from its op_name (and its name, which XLA's rematerialization suffixes with
-- '.remat'): 'remat' for the forward ops recomputed in the backward pass (jax.checkpoint: under
-- 'rematted_computation'), 'backward' for the other ops under transpose(...) (the VJP of JAX's autodiff),
-- 'forward' otherwise; NULL without an op_name.
CREATE OR REPLACE MACRO xla_pass(op_name, name := NULL) AS (
    CASE
        WHEN op_name IS NULL THEN NULL
        WHEN contains(op_name, 'rematted_computation') OR regexp_matches(COALESCE(name, ''), '\.remat\d*(\.|$)')
            THEN 'remat'
        WHEN regexp_matches(op_name, '(^|[/(;])transpose\(') THEN 'backward'
        ELSE 'forward'
    END
);

-- The named scope of an XLA op: its op_name without the last component (the primitive, e.g. dot_general) and
-- with JAX's transformation wrappers and rematerialization markers removed (jvp(mlp) -> mlp, transpose(jvp(mlp))
-- -> mlp, checkpoint/rematted_computation components), so
-- that the forward and backward ops of one scope share it; `depth` keeps the first components only (NULL: all).
-- NULL for an op_name without a scope (a parameter's name).
CREATE OR REPLACE MACRO xla_unwrap(part) AS (
    regexp_replace(regexp_replace(regexp_replace(part,
        '^(jvp|transpose|vmap|remat|checkpoint)\((.*)\)$', '\2'),
        '^(jvp|transpose|vmap|remat|checkpoint)\((.*)\)$', '\2'),
        '^(jvp|transpose|vmap|remat|checkpoint)\((.*)\)$', '\2')
);

CREATE OR REPLACE MACRO xla_scope(op_name, depth := NULL) AS (
    NULLIF(array_to_string(list_filter(list_transform(
        (string_split(op_name, '/'))[1:COALESCE(depth, len(string_split(op_name, '/')) - 1)],
        lambda part: xla_unwrap(part)),
        lambda part: part NOT IN ('', 'checkpoint', 'remat', 'rematted_computation')), '/'), '')
);
