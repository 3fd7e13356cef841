-- Element sizes, collective names and tensor sizes from what profilers record.

-- Bytes per element of a dtype as PyTorch, Kineto, XLA and NCCL spell it ('float', 'c10::BFloat16', 'bf16',
-- 'Float8_e4m3fn', 'f32', ...). NULL for non-tensor entries ('Scalar', 'TensorList', '').
CREATE OR REPLACE MACRO dtype_bytes(dtype) AS (
    CASE
        WHEN dtype IS NULL THEN NULL
        WHEN regexp_matches(lower(dtype), '(float8|fp8|f8|e4m3|e5m2|float4|fp4|e2m1|uint8|int8|byte|char|bool|^u8$|^s8$|^i8$|^pred$)') THEN 1
        WHEN regexp_matches(lower(dtype), '(bfloat16|bf16|half|float16|fp16|^f16$|int16|short|^s16$|^u16$|^i16$)') THEN 2
        WHEN regexp_matches(lower(dtype), '(complexdouble|complex128|^c128$)') THEN 16
        WHEN regexp_matches(lower(dtype), '(double|float64|fp64|^f64$|int64|long|uint64|^s64$|^u64$|^i64$|complexfloat|complex64|^c64$)') THEN 8
        WHEN regexp_matches(lower(dtype), '(float|fp32|^f32$|tf32|int32|^int$|uint32|^s32$|^u32$|^i32$)') THEN 4
        ELSE NULL
    END
);

-- A collective's canonical name from what the trace calls it: 'allreduce', '_allgather_base', 'c10d::allreduce_',
-- 'ncclKernel_AllReduce_RING_LL_Sum_float(...)', 'ncclDevKernel_AllGather_RING_LL', 'all-reduce.3' (XLA) ...
CREATE OR REPLACE MACRO collective_kind(source_name) AS (
    CASE
        WHEN source_name IS NULL THEN NULL
        -- expert-parallel all-to-all run as kernels (DeepEP's dispatch / combine and their notify kernels)
        WHEN regexp_matches(lower(source_name),
                            '(deep_ep|dpsk::ep)::(intranode|internode|internode_ll)::|a2a_?(dispatch|combine)')
            THEN 'all_to_all'
        WHEN regexp_matches(lower(source_name), 'all_?-?reduce') THEN 'all_reduce'
        WHEN regexp_matches(lower(source_name), 'reduce_?-?scatter') THEN 'reduce_scatter'
        WHEN regexp_matches(lower(source_name), 'all_?-?gather') THEN 'all_gather'
        WHEN regexp_matches(lower(source_name), 'all_?-?to_?-?all') THEN 'all_to_all'
        WHEN regexp_matches(lower(source_name), 'sendrecv') THEN 'send_recv'
        WHEN regexp_matches(lower(source_name), 'broadcast|bcast') THEN 'broadcast'
        WHEN regexp_matches(lower(source_name), 'barrier') THEN 'barrier'
        WHEN regexp_matches(lower(source_name), 'collective-?permute') THEN 'collective_permute'
        WHEN regexp_matches(lower(source_name), '(^|[^a-z])send') THEN 'send'
        WHEN regexp_matches(lower(source_name), '(^|[^a-z])recv') THEN 'recv'
        WHEN regexp_matches(lower(source_name), '(^|[^a-z_])reduce') THEN 'reduce'
        WHEN regexp_matches(lower(source_name), 'gather') THEN 'gather'
        WHEN regexp_matches(lower(source_name), 'scatter') THEN 'scatter'
        ELSE lower(source_name)
    END
);

-- What calls are matched by across ranks besides group and sequence: a send on one rank and the recv on its
-- peer are one point-to-point instance ('p2p': send, recv, send_recv); any other collective only meets its own
-- kind.
CREATE OR REPLACE MACRO collective_match_class(collective) AS (
    CASE WHEN collective IN ('send', 'recv', 'send_recv') THEN 'p2p' ELSE collective END
);

-- The key of one collective instance across ranks: group, class and sequence number. Calls of different kinds
-- never share one, also where the trace records no group (pg_name NULL) or no sequence number (tracesql counts
-- each class's calls), or a backend numbers its point-to-point calls apart from its collectives.
CREATE OR REPLACE MACRO collective_match_key(pg_name, collective, seq) AS (
    COALESCE(pg_name, '') || '|' || collective_match_class(collective) || '|' || CAST(seq AS VARCHAR)
);

-- The sending and the receiving rank of a point-to-point call whose peer is known (collectives.peer); NULL for
-- other calls.
CREATE OR REPLACE MACRO p2p_src_rank(collective, rank, peer) AS (
    CASE WHEN peer IS NOT NULL THEN CASE collective WHEN 'send' THEN rank WHEN 'recv' THEN peer END END
);
CREATE OR REPLACE MACRO p2p_dst_rank(collective, rank, peer) AS (
    CASE WHEN peer IS NOT NULL THEN CASE collective WHEN 'send' THEN peer WHEN 'recv' THEN rank END END
);

-- The key of one send/recv pair across ranks: the n-th transfer from src to dst within a group (n counted by each
-- of the two ranks in time order), which the sender's send and the receiver's recv share.
CREATE OR REPLACE MACRO p2p_match_key(pg_name, src_rank, dst_rank, n) AS (
    COALESCE(pg_name, '') || '|p2p|' || CAST(src_rank AS VARCHAR) || '>' || CAST(dst_rank AS VARCHAR) || '|'
        || CAST(n AS VARCHAR)
);

-- Elements of the n-th tensor (or tensor list, summed) in a Kineto 'Input Dims' JSON value such as
-- [[], [[8]], [], []] or [[8], [16]], counting only entries with a shape: the message of c10d ops that record no
-- 'In msg nelems'.
CREATE OR REPLACE MACRO tensor_numel(input_dims, n) AS (
    list_filter(
        list_transform(TRY_CAST(input_dims AS JSON[]), lambda d:
            CASE WHEN len(TRY_CAST(d AS BIGINT[])) > 0
                      AND len(list_filter(TRY_CAST(d AS BIGINT[]), lambda v: v IS NULL)) = 0
                     THEN list_product(TRY_CAST(d AS BIGINT[]))
                 WHEN len(TRY_CAST(d AS BIGINT[][])) > 0
                     THEN list_sum(list_transform(TRY_CAST(d AS BIGINT[][]), lambda t: list_product(t)))
            END),
        lambda x: x IS NOT NULL)[n]
);
