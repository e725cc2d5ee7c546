//! Every option, declared once: its typed field in `CompileConfig` or `RuntimeConfig`, kiln's
//! default, its value kind, its status on this target, the seed documents and spellings it comes
//! from, and its meaning. The `section!` macro turns each table into the struct, its `Default`,
//! its registry entries (`SPECS`) and name-based access to the fields.

use crate::kind::{ANY_FLOAT, INT, Kind, POSITIVE, UINT, float, float_open_max, float_open_min, int};
use crate::registry::{Origin, Section, SeedDoc, Status};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

const IMPLEMENTED: Status = Status::Implemented;

/// Not yet implemented, and refused: results would differ from what was asked.
const fn nyi_error(note: &'static str) -> Status {
    Status::NotYetImplemented { fatal: true, note }
}

/// Not yet implemented; running without it is safe, so only a warning.
const fn nyi_warn(note: &'static str) -> Status {
    Status::NotYetImplemented { fatal: false, note }
}

const fn no_effect(reason: &'static str) -> Status {
    Status::NoEffect { reason }
}

const fn qaic(key: &'static str) -> Origin {
    Origin {
        doc: SeedDoc::Qaic,
        key,
    }
}
const fn aic(key: &'static str) -> Origin {
    Origin {
        doc: SeedDoc::AicCompilerConfig,
        key,
    }
}
const fn aic_rt(key: &'static str) -> Origin {
    Origin {
        doc: SeedDoc::AicRuntimeConfig,
        key,
    }
}
const fn qairt(key: &'static str) -> Origin {
    Origin {
        doc: SeedDoc::CompileConfig,
        key,
    }
}
const fn ctx(key: &'static str) -> Origin {
    Origin {
        doc: SeedDoc::HtpContextConfig,
        key,
    }
}
const fn graph(key: &'static str) -> Origin {
    Origin {
        doc: SeedDoc::HtpGraphConfig,
        key,
    }
}
const fn device(key: &'static str) -> Origin {
    Origin {
        doc: SeedDoc::HtpDeviceConfig,
        key,
    }
}
const fn core(key: &'static str) -> Origin {
    Origin {
        doc: SeedDoc::HtpDeviceCoreConfig,
        key,
    }
}
const fn memory(key: &'static str) -> Origin {
    Origin {
        doc: SeedDoc::HtpMemoryConfig,
        key,
    }
}
const fn group(key: &'static str) -> Origin {
    Origin {
        doc: SeedDoc::HtpGroupContextConfig,
        key,
    }
}
const fn axl(key: &'static str) -> Origin {
    Origin {
        doc: SeedDoc::Axelera,
        key,
    }
}

// Reasons shared by several options.
const DEVICE: &str = "kiln runs on the host CPU: there is no accelerator device, card, SoC or DSP to select";
const DEVICE_IO: &str = "inputs and outputs stay in host memory: nothing is packed or transferred to a device";
const DDR: &str = "host and compute share one memory here: there is no device DDR traffic to reduce or measure";
const VTCM: &str = "the CPU has no VTCM or other software-managed on-chip memory: its caches are managed by hardware";
const PMU: &str = "accelerator performance counters (PMU events) do not exist on this target";
const TILING: &str = "kiln's CPU kernels choose their own tile sizes for the cache hierarchy";
const MULTI_DEVICE: &str = "kiln runs a program on one host: there is no multi-device partitioning";
const AIPU: &str =
    "a detail of the Axelera AIPU (memory pools, DMA, in-memory-compute array, task lists): no such hardware here";
const AXL_REWRITE: &str =
    "an Axelera legalisation for its hardware; kiln's CPU kernels run the original operator as written";
const HEXAGON: &str = "a Hexagon DSP runtime detail (HVX/HMX, process domains, RPC polling): there is no DSP here";
const TVM: &str = "an internal of Axelera's TVM-based compiler; kiln's compiler has no such stage";
const FP16: &str =
    "fp16 execution is not yet implemented: kiln computes in the model's own precision, so results would differ";
const ONE_GRAPH: &str = "a .kiln program holds the model's one graph; graph configs apply to it whatever its name";
const DEPTH_FIRST: &str = "general depth-first (cache-blocked) scheduling is not yet implemented; results are the same without it. At optimization level 2 and up kiln already runs a 1x1 expansion and the depthwise convolution reading it depth-first (a ring of rows in L2) whatever this option says";
const STATS: &str = "compile-time statistics and performance messages are not yet reported";
const INPUT_FORMATS: &str = "ONNX models declare their own inputs and outputs; kiln reads them from the model";

macro_rules! choice_enum {
    ($(#[$m:meta])* $name:ident { $($var:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
        pub enum $name { $( #[serde(rename = $s)] $var ),+ }
        impl $name {
            pub const CHOICES: &'static [&'static str] = &[$($s),+];
            pub fn as_str(self) -> &'static str { match self { $(Self::$var => $s),+ } }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }
    };
}

choice_enum!(
    /// AIC PMU recipe (`HmxMacs` is accepted by qaic only).
    PmuRecipe { AxiRd = "AxiRd", AxiWr = "AxiWr", AxiRdWr = "AxiRdWr", KernelUtil = "KernelUtil", HmxMacs = "HmxMacs" }
);
choice_enum!(
    /// Memory type of I/O tensors (QAIRT).
    IoTensorMemType { Raw = "raw", MemHandle = "memhandle" }
);
choice_enum!(
    /// Compilation mode of `CompileConfig.set_mode`.
    CompileMode { WeightSharing = "weight_sharing" }
);
choice_enum!(
    /// qaic quantization schema for activations.
    ActivationSchema {
        Asymmetric = "asymmetric",
        Symmetric = "symmetric",
        SymmetricWithUint8 = "symmetric_with_uint8",
        SymmetricWithPower2Scale = "symmetric_with_power2_scale",
    }
);
choice_enum!(
    /// qaic quantization schema for constants.
    ConstantSchema { Asymmetric = "asymmetric", Symmetric = "symmetric", SymmetricWithUint8 = "symmetric_with_uint8" }
);
choice_enum!(
    /// qaic calibration method (`None` is MinMax).
    Calibration {
        None = "None",
        KlMinimization = "KLMinimization",
        KlMinimizationV2 = "KLMinimizationV2",
        Percentile = "Percentile",
        Mse = "MSE",
        Sqnr = "SQNR",
    }
);
choice_enum!(
    /// qaic quantization precision.
    QuantPrecision { Int8 = "Int8" }
);
choice_enum!(
    /// qaic quantization precision of biases.
    BiasPrecision { Int8 = "Int8", Int32 = "Int32" }
);
choice_enum!(
    /// HTP process-domain attribute.
    PdSession { Signed = "signed", Unsigned = "unsigned" }
);
choice_enum!(
    /// HTP profiling level.
    HtpProfilingLevel { Linting = "linting" }
);
choice_enum!(
    /// HTP performance profile of a core.
    PerfProfile {
        LowBalanced = "low_balanced",
        Balanced = "balanced",
        Default = "default",
        HighPerformance = "high_performance",
        SustainedHighPerformance = "sustained_high_performance",
        Burst = "burst",
        LowPowerSaver = "low_power_saver",
        PowerSaver = "power_saver",
        HighPowerSaver = "high_power_saver",
        ExtremePowerSaver = "extreme_power_saver",
    }
);
choice_enum!(
    /// HTP memory type.
    HtpMemType { SharedBuffer = "shared_buffer" }
);
choice_enum!(
    /// Axelera compiler mode.
    AxeleraCompilerMode { QuantizeAndLower = "quantize_and_lower", QuantizeOnly = "quantize_only", LowerOnly = "lower_only" }
);
choice_enum!(
    /// Axelera quantization scheme.
    QuantizationScheme {
        PerTensorHistogram = "per_tensor_histogram",
        PerTensorMinMax = "per_tensor_min_max",
        HybridPerTensorPerChannel = "hybrid_per_tensor_per_channel",
    }
);
choice_enum!(
    /// Axelera graph-cleaner condition.
    GraphCleanerCondition {
        MaximumWeightTensorSize = "maximum_weight_tensor_size",
        MaximumWeightTensorFirstDimensionSize = "maximum_weight_tensor_first_dimension_size",
    }
);
choice_enum!(
    /// Axelera graph-cleaner node type.
    GraphCleanerNode { MatMul = "MatMul", Gemm = "Gemm", Clip = "Clip" }
);
choice_enum!(
    /// Axelera memory pool.
    MemoryPool { Ddr = "global.ddr", L2 = "global.l2", L1 = "global.l1" }
);
choice_enum!(
    /// Axelera home of DPU constants.
    ConstantsHome { Ddr = "global.ddr", L2 = "global.l2" }
);
choice_enum!(
    /// Axelera home of DPU/DWPU instructions.
    InstructionsHome { Default = "default", L2 = "l2" }
);
choice_enum!(
    /// Axelera DPU register-allocation algorithm.
    DpuAllocation { Graph = "graph", Lazy = "lazy", BackjumpRecursive = "backjump_recursive", TryAll = "try_all" }
);
choice_enum!(
    /// Axelera multicore mode.
    MulticoreMode {
        Multiprocess = "multiprocess",
        Multithread = "multithread",
        Batch = "batch",
        Cooperative = "cooperative",
        Pipeline = "pipeline",
    }
);
choice_enum!(
    /// Axelera trace-line level.
    ProfilingLevel { Unknown = "[?]", B = "[B]", Pb = "[PB]", Pe = "[PE]", K = "[K]", M = "[M]", T = "[T]" }
);

macro_rules! section {
    (
        $(#[$meta:meta])*
        pub struct $name:ident in $section:ident {
            $( $field:ident : $ty:ty = $default:expr, $kind:expr, $status:expr, [$($origin:expr),* $(,)?], $help:literal; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct $name {
            $( #[doc = $help] pub $field: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                Self { $( $field: $default, )* }
            }
        }

        impl $name {
            /// The registry entries of this section's options, in declaration order.
            pub const SPECS: &'static [crate::registry::OptionSpec] = &[
                $( crate::registry::OptionSpec {
                    name: stringify!($field),
                    section: Section::$section,
                    kind: $kind,
                    status: $status,
                    origins: &[$($origin),*],
                    help: $help,
                }, )*
            ];

            /// An option's value as JSON, by canonical name.
            pub fn get_json(&self, name: &str) -> Option<Value> {
                match name {
                    $( stringify!($field) => Some(serde_json::to_value(&self.$field).unwrap_or(Value::Null)), )*
                    _ => None,
                }
            }

            /// Sets an option from its normalised JSON value (see `Kind::normalize`).
            pub(crate) fn set_json(&mut self, name: &str, v: Value) -> Result<(), String> {
                match name {
                    $( stringify!($field) => {
                        self.$field = serde_json::from_value(v).map_err(|e| e.to_string())?;
                        Ok(())
                    } )*
                    _ => Err(format!("no option {name} in this section")),
                }
            }
        }
    };
}

section! {
    /// Options that shape the compiled program.
    pub struct CompileConfig in Compile {
        // kiln's levels, HTP's O.
        optimization_type: u8 = 2, int(0, 3), IMPLEMENTED, [graph("O"), graph("optimization_type")],
            "Graph optimization level: 0 no graph rewrites, 1 cleanup passes, 2 fusions (default), 3 everything. HTP accepts 1-3; kiln also 0.";
        onnx_define_symbol: BTreeMap<String, u64> = BTreeMap::new(), Kind::Symbols, IMPLEMENTED, [qaic("onnx_define_symbol")],
            "Binds symbolic dimensions of the model to sizes, e.g. {batch: 1}.";
        shape_specializations: Vec<BTreeMap<String, u64>> = Vec::new(), Kind::SymbolSets, IMPLEMENTED, [],
            "kiln's own: shape sets (bindings of the model's input symbols) compiled ahead of time and stored in the program beside the shape-generic one, e.g. [{height: 640, width: 640}, {height: 320, width: 320}]; a run of other shapes compiles them on first use (shape_cache_size).";
        output_tensors: Vec<String> = Vec::new(), Kind::StrList, IMPLEMENTED, [qairt("set_output_tensors")],
            "Intermediate tensors to output in addition to the graph outputs (comma-separated or a list).";
        calibration_data: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), IMPLEMENTED, [],
            "kiln's own: calibration samples for convert_to_quantize and dump_profile: a folder of .npz files (one sample each, arrays named after the model inputs) or one .npz whose arrays carry a leading sample axis (rank = input rank + 1). The CLI's --calibration-data; Python takes a list of input dicts.";
        compile_time_limit_s: u64 = 0, UINT, IMPLEMENTED, [],
            "kiln's own: most seconds a compile (import excluded) may take; past it the compile ends with an error naming the limit and the last pass completed (checked between passes, between folded nodes and between the work chunks of kernels). 0 (default): no limit.";
        enable_intermediate_outputs: bool = false, Kind::Bool, IMPLEMENTED, [qairt("enable_intermediate_outputs")],
            "Output every intermediate tensor in addition to the graph outputs (exclusive with set_output_tensors).";
        output_dir: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), IMPLEMENTED, [qaic("output_dir"), axl("output_dir")],
            "Directory where the compiled program and other artifacts are written.";

        // QAIRT CompileConfig.
        backend: Option<String> = None, Kind::Nullable(&Kind::Str), no_effect("kiln has one backend, the host CPU; the backend named here is recorded but not used"), [qairt("backend")],
            "The vendor backend to compile for (HTP, AIC, ...).";
        backend_binary_path: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), no_effect("kiln writes a portable .kiln program (see output_dir), not a backend context binary"), [qairt("backend_binary_path")],
            "Where to save a backend-specific context binary.";
        data_format_config: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), nyi_error("per-tensor data formats are not yet implemented; the tensors would keep the model's formats"), [qairt("data_format_config")],
            "JSON file giving the data formats of certain tensors.";
        io_tensor_mem_type: IoTensorMemType = IoTensorMemType::Raw, Kind::Choice(IoTensorMemType::CHOICES), no_effect(DEVICE_IO), [qairt("io_tensor_mem_type")],
            "Memory type of input/output tensors: raw or memhandle.";
        log_level: String = "error".to_string(), Kind::Choice(&["debug", "info", "warning", "warn", "error", "critical", "fatal", "verbose"]), nyi_warn("kiln reports errors and warnings only; there is no log output to tune yet"), [qairt("log_level")],
            "Log level of the compiler.";
        op_packages: Value = Value::Array(Vec::new()), Kind::Json, nyi_error("custom op packages are not supported: kiln's operator set is closed and an unsupported op fails the load"), [qairt("op_packages")],
            "Custom op packages to use for compilation.";
        soc_details: Option<String> = None, Kind::Nullable(&Kind::Str), no_effect("kiln compiles for the host CPU and picks kernels for its features when the program is loaded"), [qairt("soc_details")],
            "Device specification, e.g. chipset:SM8550.";
        mode: Option<CompileMode> = None, Kind::Nullable(&Kind::Choice(CompileMode::CHOICES)), no_effect("weight sharing across graphs of one context: see weight_sharing_enabled"), [qairt("mode")],
            "Compilation mode (CompileConfig.set_mode); weight_sharing sets weight_sharing_enabled.";

        // AicCompilerConfig and the qaic compile keywords.
        buffer_dealloc_delay: u32 = 2, UINT, no_effect("kiln frees each buffer right after its last reader; there are no asynchronous device queues whose false dependencies a delay would avoid"), [aic("buffer_dealloc_delay"), qaic("allocator_dealloac_delay"), qaic("allocator_dealloc_delay")],
            "Extra lifetime of buffers to reduce false dependencies.";
        cluster_sizes: Vec<i64> = Vec::new(), Kind::IntList, no_effect("single-device partitioning splits work over accelerator core clusters; the CPU has none"), [aic("cluster_sizes"), qaic("sdp_cluster_sizes")],
            "Cluster configuration for single-device partitioning.";
        combine_inputs: bool = true, Kind::Bool, no_effect(DEVICE_IO), [aic("combine_inputs"), qaic("combine_inputs")],
            "Combine inputs into fewer buffers for transfer to the device.";
        combine_outputs: bool = true, Kind::Bool, no_effect(DEVICE_IO), [aic("combine_outputs"), qaic("combine_outputs")],
            "Combine outputs into one buffer for transfer to the host.";
        compilation_target: String = "hardware".to_string(), Kind::Str, no_effect("kiln always compiles for the CPU it runs on; there is no simulator target"), [aic("compilation_target")],
            "Compilation target of the graph (hardware, ...).";
        compile_threads: u32 = 2, POSITIVE, nyi_warn("compilation is single-threaded for now; the program is the same either way"), [aic("compile_threads"), qaic("compile_threads")],
            "Number of threads used for compilation.";
        convert_to_fp16: bool = false, Kind::Bool, nyi_error(FP16), [aic("convert_to_fp16"), qaic("convert_to_fp16")],
            "Run all floating-point computation in fp16.";
        crc_stride: u32 = 256, POSITIVE, IMPLEMENTED, [aic("crc_stride"), qaic("io_crc_stride")],
            "Stride of the CRC computed over inputs and outputs: of every crc_stride-byte section of a tensor's bytes its first 8 are summed (CRC-32, IEEE), then the byte length; 1 sums every byte.";
        direct_api: bool = true, Kind::Bool, no_effect(DEVICE_IO), [aic("direct_api")],
            "Use a platform-specific shared-memory API for device transfers.";
        do_ddr_to_multicast: bool = true, Kind::Bool, no_effect(DDR), [aic("do_ddr_to_multicast"), qaic("multicast_weights")],
            "Load weights used on several cores once and multicast them (DDR bandwidth).";
        do_host_preproc: bool = true, Kind::Bool, no_effect("all pre- and post-processing already runs on the host, the only processor here"), [aic("do_host_preproc"), qaic("host_preproc")],
            "Run pre-/post-processing on the host.";
        aic_preproc: bool = false, Kind::Bool, no_effect("there is no accelerator to move pre- and post-processing to"), [qaic("aic_preproc")],
            "Run pre-/post-processing on the accelerator instead of the host.";
        enable_debug: bool = false, Kind::Bool, nyi_warn("kiln has no separate debug compilation mode yet"), [aic("enable_debug"), qaic("enable_debug"), qairt("debug")],
            "Debug mode during compilation.";
        enable_depth_first: bool = false, Kind::Bool, nyi_warn(DEPTH_FIRST), [aic("enable_depth_first"), qaic("aic_enable_depth_first")],
            "Depth-first scheduling with the default memory size.";
        aic_depth_first_mem: Option<u32> = None, Kind::Nullable(&int(8, 32)), nyi_warn(DEPTH_FIRST), [qaic("aic_depth_first_mem")],
            "Memory size for depth-first scheduling, 8-32.";
        exclude_mxfp6_matmul: String = String::new(), Kind::Str, nyi_warn("only matters with mxfp6_matmul_weights, which is not yet implemented"), [aic("exclude_mxfp6_matmul")],
            "Operations to exclude from MXFP6 matmul.";
        force_vtcm_spill: bool = false, Kind::Bool, no_effect(VTCM), [aic("force_vtcm_spill")],
            "Force all VTCM buffers to be spilled to DDR.";
        gen_crc: bool = false, Kind::Bool, IMPLEMENTED, [aic("gen_crc"), qaic("io_crc")],
            "CRC check of the network's inputs and outputs: each input's CRC is taken when a run starts and, for inputs read in place from memory others can write (numpy arrays, shared buffers), again when it ends (a mismatch fails the run); each output's when returned; kiln run --crc and kiln bench --json report them. Off by default as qaic's io_crc (AIC's gen_crc defaults to on); a program compiled with it keeps it.";
        graph_names: Vec<String> = Vec::new(), Kind::StrList, no_effect(ONE_GRAPH), [aic("graph_names"), graph("graph_names"), graph("name"), qairt("graph_names")],
            "Names of the graphs (HTP: the graphs a graph config applies to).";
        hardware_version: String = "2.0".to_string(), Kind::Str, no_effect(DEVICE), [aic("hardware_version")],
            "AI 100 hardware version to generate the binary for.";
        max_out_channel_split: Vec<i64> = Vec::new(), Kind::IntList, no_effect(VTCM), [aic("max_out_channel_split"), qaic("mos")],
            "Effort level to reduce on-chip memory use.";
        mdp_dump_partition_config: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), no_effect(MULTI_DEVICE), [aic("mdp_dump_partition_config"), qaic("mdp_dump_partition_config")],
            "Dump the multi-device partition template.";
        mdp_load_partition_config: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), no_effect(MULTI_DEVICE), [aic("mdp_load_partition_config"), qaic("mdp_load_partition_config")],
            "Load a multi-device partition configuration.";
        mxfp6_matmul_weights: bool = false, Kind::Bool, nyi_error("MXFP6 weight compression is not yet implemented; results would differ"), [aic("mxfp6_matmul_weights")],
            "Store matmul weights as MXFP6.";
        mxint8_mdp_io: bool = false, Kind::Bool, no_effect(MULTI_DEVICE), [aic("mxint8_mdp_io")],
            "MXINT8 for tensors passed between devices.";
        overlap_split_factor: u32 = 2, POSITIVE, no_effect("splits operations across accelerator cores; kiln's kernels split work over threads themselves (see num_of_cores)"), [aic("overlap_split_factor"), qaic("ols")],
            "Factor to increase splitting of operations for parallelism.";
        perf_warnings: bool = false, Kind::Bool, nyi_warn(STATS), [aic("perf_warnings"), qaic("aic_perf_warnings")],
            "Print performance warnings.";
        pmu_events: String = String::new(), Kind::Str, no_effect(PMU), [aic("pmu_events"), qaic("aic_pmu_events")],
            "PMU events to track (up to 8).";
        pmu_recipe_opt: PmuRecipe = PmuRecipe::KernelUtil, Kind::Choice(PmuRecipe::CHOICES), no_effect(PMU), [aic("pmu_recipe_opt"), qaic("aic_pmu_recipe")],
            "Built-in PMU recipe.";
        print_ddr_stats: bool = false, Kind::Bool, no_effect(DDR), [aic("print_ddr_stats"), qaic("ddr_stats")],
            "Collect per-core DDR traffic.";
        print_perf_metrics: bool = false, Kind::Bool, nyi_warn(STATS), [aic("print_perf_metrics"), qaic("aic_perf_metrics")],
            "Print compiler performance metrics.";
        retained_state: bool = false, Kind::Bool, nyi_error("state kept between runs (e.g. a KV cache held by the runtime) is not yet implemented; the model's I/O would differ"), [aic("retained_state")],
            "Keep state tensors in the runtime between runs.";
        size_split_granularity: u32 = 1024, int(512, 2048), no_effect(TILING), [aic("size_split_granularity"), qaic("size_split_granularity")],
            "Maximum tile size in KiB for operations too large for fast memory, 512-2048.";
        stat_level: u32 = 10, UINT, nyi_warn(STATS), [aic("stat_level")],
            "Level of statistics collected when profiling.";
        stats_batch_size: u32 = 1, POSITIVE, nyi_warn(STATS), [aic("stats_batch_size"), qaic("stats_batchsize")],
            "Batch size used to normalise performance statistics.";
        time_passes: bool = false, Kind::Bool, nyi_warn(STATS), [aic("time_passes"), qaic("time_passes")],
            "Report compile-time statistics per pass.";
        user_dma_producer_dma_enabled: bool = true, Kind::Bool, no_effect(DEVICE_IO), [aic("user_dma_producer_dma_enabled"), qaic("use_producer_dma")],
            "Start NSP DMAs from the thread producing the data.";
        vtcm_working_set_limit_ratio: f64 = 1.0, float_open_min(0.0, 1.0), no_effect(VTCM), [aic("vtcm_working_set_limit_ratio"), qaic("vtcm_working_set_limit_ratio")],
            "Largest fraction of fast memory one instruction may use, in (0, 1].";
        output_node_names: Vec<String> = Vec::new(), Kind::StrList, nyi_error("choosing or reordering the graph outputs is not yet implemented (set_output_tensors adds outputs)"), [qaic("output_node_names")],
            "Output node names in model order (mandatory for TF models).";
        model_inputs: Value = Value::Null, Kind::Json, no_effect(INPUT_FORMATS), [qaic("model_inputs")],
            "Input names, types and shapes (mandatory for PyTorch models).";
        execute_nodes_in_fp16: Vec<String> = Vec::new(), Kind::StrList, nyi_error(FP16), [qaic("execute_nodes_in_fp16")],
            "Operator types to run in fp16.";
        node_precision_info_file: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), nyi_error(FP16), [qaic("node_precision_info_file")],
            "File naming nodes to run in fp16 or fp32.";
        keep_original_precision_for_nodes: Vec<String> = Vec::new(), Kind::StrList, IMPLEMENTED, [qaic("keep_original_precision_for_nodes")],
            "Operator types kept in original precision when quantizing, as ONNX spells them (kiln quantizes Conv, ConvTranspose, MatMul and Gemm; listing one keeps it in float, other types are in float already).";
        custom_io_list_file: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), IMPLEMENTED, [qaic("custom_io_list_file")],
            "YAML list of inputs and outputs taken or returned otherwise than the model has them: per entry `IOName`, `Layout` (NCHW or NHWC, rank-4 tensors), `Precision` (float, float16, uint8, int8) and, for 8-bit ones, `Scale` and `Offset` (the zero point). An 8-bit input is dequantized on entry, an 8-bit output quantized on exit, an NHWC one transposed; f32 tensors only. Start from the template `dump_custom_io_config_template_file` writes.";
        dump_custom_io_config_template_file: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), IMPLEMENTED, [qaic("dump_custom_io_config_template_file")],
            "Write the model's inputs and outputs as a custom I/O file to edit (every entry as the model has it: NCHW for rank-4 tensors, float), then compile as usual.";
        external_quantization_file: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), IMPLEMENTED, [qaic("external_quantization_file")],
            "Ranges from a JSON file instead of profiling: an object of tensor name to {\"min\": a, \"max\": b}, [a, b] or ONNX Runtime's calibration-table {\"lowest\": a, \"highest\": b}; the activations it does not list are calibrated on calibration_data (an error naming them without it). The schema rules then apply as for calibrated ranges.";
        quantization_schema_activations: ActivationSchema = ActivationSchema::SymmetricWithUint8, Kind::Choice(ActivationSchema::CHOICES), IMPLEMENTED, [qaic("quantization_schema_activations")],
            "Quantization schema of activations, Glow's rules: every range first widened to hold 0; asymmetric: uint8, scale (max - min) / 255, zero point from the end that rounds better; symmetric: int8, zero point 0, the range widened to [-128 s, 127 s]; symmetric_with_uint8 (default): uint8 with zero point 0 when the range has no negatives, else symmetric; symmetric_with_power2_scale: symmetric with the scale rounded up to a power of two.";
        quantization_schema_constants: ConstantSchema = ConstantSchema::SymmetricWithUint8, Kind::Choice(ConstantSchema::CHOICES), IMPLEMENTED, [qaic("quantization_schema_constants")],
            "Quantization schema of per-tensor constant weights (asymmetric, symmetric, symmetric_with_uint8 as for activations). Per-channel and row-wise weights are symmetric int8 whatever this says (Glow's and TFLite's convention).";
        quantization_calibration: Calibration = Calibration::None, Kind::Choice(Calibration::CHOICES), IMPLEMENTED, [qaic("quantization_calibration")],
            "Calibration method, choosing each activation's range from its histogram over the calibration samples: None (default): MinMax, the observed range. KLMinimization: Glow's optimizeKL, a window shrinking over the bins (both ends together for symmetric schemas, the lighter tail first for asymmetric), P = the window with the outside mass folded into its end bins, Q = the window merged into 255 levels and spread back over P's non-empty bins, the window of least KL(P||Q). KLMinimizationV2: TensorRT's entropy calibration (ONNX Runtime's Entropy) on the histogram of |x|: thresholds from bin 128 up, 128 levels, the last argmin of KL. Percentile: a one-signed tensor keeps the percentile_calibration_value-th percentile of its magnitude, a two-signed one clips (100 - p)/2 % of the values from each end. MSE: both ends scaled by one factor (128 steps), keeping the range whose actual grid gives the least squared error over the histogram. SQNR: AIMET's analyser, the same error with clipped values weighted 3, the ends scaled independently for an asymmetric grid (32 x 32) or together for a symmetric one. KL methods keep the observed range of a tensor with fewer values than bins.";
        percentile_calibration_value: f64 = 100.0, float(90.0, 100.0), IMPLEMENTED, [qaic("percentile_calibration_value")],
            "Percentile for Percentile calibration, 90-100 (100 = MinMax).";
        num_histogram_bins: u32 = 512, POSITIVE, IMPLEMENTED, [qaic("num_histogram_bins")],
            "Histogram bins per profiled tensor (default 512; KLMinimization needs at least 255, KLMinimizationV2 at least 128, else they keep the observed range). The histogram spans the tensor's range over all samples, widened to hold 0.";
        quantization_precision: QuantPrecision = QuantPrecision::Int8, Kind::Choice(QuantPrecision::CHOICES), IMPLEMENTED, [qaic("quantization_precision")],
            "Quantization precision.";
        quantization_precision_bias: BiasPrecision = BiasPrecision::Int32, Kind::Choice(BiasPrecision::CHOICES), IMPLEMENTED, [qaic("quantization_precision_bias")],
            "Quantization precision of biases: Int32 (default; scale = input scale x weight scale per channel, zero point 0) or Int8 (symmetric over the bias's own range).";
        enable_rowwise: bool = false, Kind::Bool, IMPLEMENTED, [qaic("enable_rowwise")],
            "Row-wise quantization of FullyConnected: constant MatMul/Gemm weights get one symmetric int8 scale per output feature.";
        enable_channelwise: bool = false, Kind::Bool, IMPLEMENTED, [qaic("enable_channelwise")],
            "Channel-wise quantization of Convolution: Conv (and ConvTranspose with group 1) weights get one symmetric int8 scale per output channel, the int32 bias one per channel too.";
        dump_profile: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), IMPLEMENTED, [qaic("dump_profile")],
            "Profile the calibration data and write the profile (Glow's YAML: GlowToolsVersion, GraphPreLowerHash, then NodeOutputName = the ONNX tensor name, Min, Max and Histogram per tensor); then the float model is compiled, as qaic does.";
        load_profile: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), IMPLEMENTED, [qaic("load_profile")],
            "Quantize from a profile written by dump_profile (no calibration data needed); a profile of another graph is refused, naming both hashes.";
        convert_to_quantize: bool = false, Kind::Bool, IMPLEMENTED, [qaic("convert_to_quantize")],
            "Profile the calibration data (calibration_data / --calibration-data) and compile quantized: QuantizeLinear/DequantizeLinear at the inputs of Conv, ConvTranspose, MatMul and Gemm, weights in 8 bits, biases in int32; the compile prints the SQNR of each output against the float model on the calibration samples (kiln compile --report FILE writes it as JSON).";
        profiling_threads: u32 = 1, POSITIVE, IMPLEMENTED, [qaic("profiling_threads")],
            "Calibration samples profiled at once (each run on one thread).";
        load_embedding_tables: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), nyi_error("external embedding tables (DLRM, RecSys) are not yet implemented; the model's own tables would be used"), [qaic("load_embedding_tables")],
            "Load embedding tables from a zip file.";
        dump_embedding_tables: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), no_effect("extracts tables from a PyTorch model; kiln loads ONNX models only"), [qaic("dump_embedding_tables")],
            "Extract embedding tables from a PyTorch model.";
        dynamic_shape_input: Vec<String> = Vec::new(), Kind::StrList, no_effect("kiln treats every unbound symbolic dimension as dynamic and compiles each new input shape on its first run (shape_cache_size); no input needs to be declared"), [qaic("dynamic_shape_input")],
            "Inputs to treat as having dynamic shape.";
        always_expand_onnx_functions: bool = false, Kind::Bool, no_effect("kiln always inlines model-local functions and runs standard function ops with kernels that compute the same result"), [qaic("always_expand_onnx_functions")],
            "Force the expansion of ONNX functions.";

        // HTP context.
        extended_udma: bool = false, Kind::Bool, no_effect(HEXAGON), [ctx("extended_udma")],
            "User DMA (HTP v81+).";
        file_read_memory_budget_in_mb: u64 = 0, UINT, no_effect("kiln memory-maps the program: the OS reads it in as pages are touched"), [ctx("file_read_memory_budget_in_mb")],
            "Read the serialized binary in chunks of this many MB.";
        group_id: u32 = 0, UINT, no_effect("context groups share a DSP's spill-fill memory; there is none here"), [ctx("group_id")],
            "Group to which the context belongs.";
        init_acceleration: bool = false, Kind::Bool, no_effect(HEXAGON), [ctx("init_acceleration")],
            "Accelerate context creation from a binary.";
        io_memory_estimation: bool = false, Kind::Bool, no_effect("process-domain memory is a DSP resource; kiln's memory is the host's"), [ctx("io_memory_estimation")],
            "Estimate I/O memory before deserialization.";
        lora_weight_sharing: bool = false, Kind::Bool, nyi_error("LoRA adapters are not yet implemented"), [ctx("lora_weight_sharing")],
            "Share weights between LoRA adapters when preparing offline.";
        lora_weight_sharing_ram_preload: bool = false, Kind::Bool, nyi_warn("LoRA adapters are not yet implemented"), [ctx("lora_weight_sharing_ram_preload")],
            "Preload shared LoRA weights into RAM.";
        max_spill_fill_buffer_for_group: u64 = 0, UINT, no_effect("context groups share a DSP's spill-fill memory; there is none here"), [ctx("max_spill_fill_buffer_for_group")],
            "Largest spill-fill buffer across the contexts of a group (group_id must be 0).";
        weight_sharing_enabled: bool = false, Kind::Bool, no_effect("a .kiln program holds one graph and its weights are memory-mapped, so sessions of one program already share them through the page cache"), [ctx("weight_sharing_enabled")],
            "Share common weights across graphs in one context binary.";

        // HTP graph.
        advanced_activation_fusion: bool = true, Kind::Bool, nyi_warn("fusion choices are set by optimization_type only; this switch is not yet honoured"), [graph("advanced_activation_fusion")],
            "Fuse convolutions with sigmoid, tanh, gelu, swish.";
        assume_same_quant: bool = false, Kind::Bool, nyi_warn("LoRA adapters are not yet implemented"), [graph("assume_same_quant")],
            "Assume one quantization across LoRA adapter tensors.";
        dlbc: bool = false, Kind::Bit, no_effect("deep-learning bandwidth compression is a DSP memory-interface feature"), [graph("dlbc")],
            "Deep-learning bandwidth compression, 0 or 1.";
        dlbc_weights: u32 = 0, UINT, no_effect("deep-learning bandwidth compression is a DSP memory-interface feature"), [graph("dlbc_weights")],
            "Number of weights to compress when dlbc is 1.";
        finalize_config: Option<Value> = None, Kind::Nullable(&Kind::Json), no_effect("backend-specific finalize options of the HTP graph"), [graph("finalize_config")],
            "Finalize config dict of the backend extension.";
        fold_relu_activation_into_conv_off: bool = false, Kind::Bool, nyi_warn("fusion choices are set by optimization_type only; this switch is not yet honoured"), [graph("fold_relu_activation_into_conv_off")],
            "Do not fold ReLU into convolutions.";
        fp16_relaxed_precision: bool = false, Kind::Bit, nyi_error(FP16), [graph("fp16_relaxed_precision"), qairt("fp16")],
            "Compute floating point in half precision.";
        hvx_threads: u32 = 0, UINT, no_effect("HVX threads are Hexagon vector units; CPU threads are set by num_of_cores"), [graph("hvx_threads"), qairt("hvx_threads")],
            "HVX threads for a graph during inference.";
        monolithic_lstm: bool = false, Kind::Bool, no_effect("an HTP LSTM lowering choice; kiln runs LSTM as one operator"), [graph("monolithic_lstm")],
            "Monolithic LSTM for the graph.";
        short_depth_conv_on_hmx_off: bool = false, Kind::Bool, no_effect(HEXAGON), [graph("short_depth_conv_on_hmx_off")],
            "Keep short-depth convolutions off HMX.";
        use_high_precision_fp16_sigmoid: bool = false, Kind::Bool, no_effect("kiln never computes sigmoid in fp16 (f16 inputs are computed in f32)"), [graph("use_high_precision_fp16_sigmoid")],
            "High-precision fp16 sigmoid.";
        vtcm_size: u64 = 0, UINT, no_effect(VTCM), [graph("vtcm_size")],
            "VTCM size (0: the device maximum).";
        vtcm_size_in_mb: u32 = 0, UINT, no_effect(VTCM), [graph("vtcm_mb"), graph("vtcm_size_in_mb"), qairt("vtcm_size_in_mb")],
            "VTCM size in MB (0: the device maximum).";
        weights_packing: bool = false, Kind::Bool, no_effect("kiln packs weights for its own kernels whatever this says"), [graph("weights_packing")],
            "Weight packing.";

        // HTP device and core.
        core_ids: Option<Vec<u32>> = None, Kind::Nullable(&Kind::IntList), no_effect(DEVICE), [device("core_ids")],
            "Cores to use among those of a device.";
        core_type: u8 = 0, int(0, 1), no_effect(DEVICE), [device("core_type")],
            "Core type: 0 NSP, 1 HPASS.";
        dsp_arch: Option<String> = None, Kind::Nullable(&Kind::Str), no_effect(DEVICE), [device("dsp_arch"), qairt("dsp_arch")],
            "DSP architecture of the SoC (e.g. v73).";
        device_id: u32 = 0, UINT, no_effect(DEVICE), [device("device_id"), device("id")],
            "Id of a device config.";
        pd_session: PdSession = PdSession::Unsigned, Kind::Choice(PdSession::CHOICES), no_effect(HEXAGON), [device("pd_session")],
            "User process-domain attribute: signed or unsigned.";
        profiling_level: Option<HtpProfilingLevel> = None, Kind::Nullable(&Kind::Choice(HtpProfilingLevel::CHOICES)), no_effect("HTP linting profiles report DSP stalls; see enable_profiling for kiln's profile"), [device("profiling_level")],
            "HTP profiling level (linting).";
        soc_id: u32 = 0, UINT, no_effect(DEVICE), [device("soc_id")],
            "SoC selection.";
        soc_model: u32 = 0, UINT, no_effect(DEVICE), [device("soc_model"), qairt("soc_model")],
            "Snapdragon SoC model.";
        adaptive_polling_time: u32 = 0, UINT, no_effect(HEXAGON), [core("adaptive_polling_time")],
            "Adaptive polling time in µs.";
        hmx_timeout_us: u64 = 300_000, UINT, no_effect(HEXAGON), [core("hmx_timeout_us")],
            "HMX timeout in µs.";
        core_id: u32 = 0, UINT, no_effect(DEVICE), [core("core_id"), core("id")],
            "Id of a core config.";
        perf_profile: PerfProfile = PerfProfile::Burst, Kind::Choice(PerfProfile::CHOICES), no_effect("DSP clock and power votes; the host's CPU frequency is the operating system's business"), [core("perf_profile")],
            "Performance profile.";
        rpc_control_latency: u32 = 100, UINT, no_effect(HEXAGON), [core("rpc_control_latency")],
            "RPC control latency in µs.";
        rpc_polling_time: u32 = 9999, UINT, no_effect(HEXAGON), [core("rpc_polling_time")],
            "RPC polling time in µs.";
        mem_type: HtpMemType = HtpMemType::SharedBuffer, Kind::Choice(HtpMemType::CHOICES), no_effect(DEVICE_IO), [memory("mem_type")],
            "Memory type of the HTP backend.";
        share_resources: bool = false, Kind::Bool, no_effect("resource sharing between contexts is a DSP virtual-address-space optimisation"), [group("share_resources")],
            "Share resources across contexts when generating binaries.";

        // Axelera CompilerConfig.
        apply_pword_padding: bool = true, Kind::Bool, no_effect(AXL_REWRITE), [axl("apply_pword_padding")],
            "Pad input channels to a multiple of the PWORD.";
        rewrite_concat_to_resadd: bool = true, Kind::Bool, no_effect(AXL_REWRITE), [axl("rewrite_concat_to_resadd")],
            "Rewrite concatenation as padded additions.";
        rewrite_dense_to_conv2d: bool = true, Kind::Bool, no_effect(AXL_REWRITE), [axl("rewrite_dense_to_conv2d")],
            "Rewrite dense as 1x1 conv2d.";
        remove_io_padding_and_layout_transform: bool = true, Kind::Bool, no_effect("kiln adds no padding or layout change to the inputs, so there is none to remove"), [axl("remove_io_padding_and_layout_transform")],
            "Remove input padding and layout transforms from the graph.";
        apply_arithmetic_simplification: bool = false, Kind::Bool, nyi_warn("kiln applies only rewrites that keep the numerics; fast-math simplification is not implemented"), [axl("apply_arithmetic_simplification")],
            "Fast-math arithmetic simplification (may change numerics).";
        simplify_mac_before_after_lut: bool = true, Kind::Bool, no_effect("kiln computes activations exactly, without look-up tables"), [axl("simplify_mac_before_after_lut")],
            "Fold multiply-adds around look-up-table operations.";
        validate_operators: bool = true, Kind::Bool, no_effect("kiln always checks every operator at load and reports all unsupported ones at once"), [axl("validate_operators")],
            "Check operators for hardware compatibility.";
        remove_output_dir: bool = false, Kind::Bool, nyi_warn("output_dir is never cleaned by kiln; remove it yourself"), [axl("remove_output_dir")],
            "Clean the output directory before compiling.";
        compiler_dir: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), no_effect("kiln's compiler is built in; it has no package directory"), [axl("compiler_dir")],
            "Root directory of the compiler package.";
        compiler_mode: AxeleraCompilerMode = AxeleraCompilerMode::LowerOnly, Kind::Choice(AxeleraCompilerMode::CHOICES), IMPLEMENTED, [axl("compiler_mode")],
            "quantize_and_lower (quantize on calibration_data, as convert_to_quantize, then compile), lower_only (kiln's default: compile in the model's own precision; a model already quantized runs as written) or quantize_only (writing the quantized ONNX file is not yet implemented: refused).";
        model_name: String = String::new(), Kind::Str, no_effect("kiln has no per-model tuning tables; the name is not used"), [axl("model_name")],
            "Model name for logging and model-specific settings.";
        onnx_opset_version: u32 = 17, int(17, i64::MAX), no_effect("used when exporting PyTorch to ONNX; kiln reads the opsets from the model"), [axl("onnx_opset_version")],
            "Opset for the PyTorch-to-ONNX export, >= 17.";
        quantization_debug: bool = false, Kind::Bool, IMPLEMENTED, [axl("quantization_debug")],
            "When quantizing: write the quantized graph as text (quantized_graph.txt, kiln's IR printer) and the accuracy report (quantization_report.json) into model_debug_save_dir (else output_dir, else the working directory).";
        quantization_scheme: QuantizationScheme = QuantizationScheme::PerTensorHistogram, Kind::Choice(QuantizationScheme::CHOICES), IMPLEMENTED, [axl("quantization_scheme")],
            "Post-training quantization scheme, with compiler_mode quantize_and_lower: per_tensor_histogram (default) = KLMinimization ranges, per-tensor weights; per_tensor_min_max = MinMax ranges; hybrid_per_tensor_per_channel = KLMinimization ranges, per-channel Conv weights. A quantization_calibration that contradicts it is an error.";
        model_debug_save_dir: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), IMPLEMENTED, [axl("model_debug_save_dir")],
            "Where quantization_debug and quantized_graph_export write (default: output_dir, else the working directory).";
        quantize_dw_channel_wise: bool = false, Kind::Bool, IMPLEMENTED, [axl("quantize_dw_channel_wise")],
            "Quantize depthwise convolutions channel-wise (implied by enable_channelwise).";
        quantized_graph_export: bool = false, Kind::Bool, IMPLEMENTED, [axl("quantized_graph_export")],
            "When quantizing: write quantized_graph.json (every node with its inputs and outputs, and each quantized tensor's dtype, scale, zero point, axis and calibrated range) into model_debug_save_dir (else output_dir, else the working directory).";
        remove_io_quantization: bool = false, Kind::Bool, IMPLEMENTED, [axl("remove_io_quantization")],
            "When quantizing: the program takes each float input its quantized nodes read as the 8-bit values of that input's QuantizeLinear, and returns each float output in 8 bits on the grid of its calibrated range (outputs are calibrated too), under the same names; the scale and zero point of each are in the compile report and kiln info.";
        run_graph_cleaner: bool = true, Kind::Bool, no_effect("kiln's cleanup passes (optimization_type >= 1) take the graph cleaner's place"), [axl("run_graph_cleaner")],
            "Run the ONNX graph cleaner.";
        graph_cleaner_split_pre_post_processing: bool = true, Kind::Bool, no_effect("kiln runs pre- and post-processing nodes in the program like any other"), [axl("graph_cleaner_split_pre_post_processing")],
            "Split pre/post processing in the graph cleaner.";
        graph_cleaner_condition: Option<GraphCleanerCondition> = None, Kind::Nullable(&Kind::Choice(GraphCleanerCondition::CHOICES)), no_effect(TVM), [axl("graph_cleaner_condition")],
            "Condition of the graph cleaner.";
        graph_cleaner_node: Option<GraphCleanerNode> = None, Kind::Nullable(&Kind::Choice(GraphCleanerNode::CHOICES)), no_effect(TVM), [axl("graph_cleaner_node")],
            "Node type the graph-cleaner condition applies to.";
        graph_cleaner_threshold: i64 = 0, INT, no_effect(TVM), [axl("graph_cleaner_threshold")],
            "Threshold of the graph-cleaner condition.";
        graph_cleaner_dump_core_onnx: Option<String> = None, Kind::Nullable(&Kind::Str), no_effect(TVM), [axl("graph_cleaner_dump_core_onnx")],
            "Save the cleaned core ONNX model.";
        graph_cleaner_dump_full_opt_onnx: Option<String> = None, Kind::Nullable(&Kind::Str), no_effect(TVM), [axl("graph_cleaner_dump_full_opt_onnx")],
            "Save the full optimized ONNX model.";
        remove_layout_transform_from_preamble: bool = false, Kind::Bool, no_effect("kiln keeps the model's input layout as declared"), [axl("remove_layout_transform_from_preamble")],
            "Remove the NHWC layout transform from the preamble.";
        pipeline_spatial_tiles: bool = true, Kind::Bool, no_effect(AIPU), [axl("pipeline_spatial_tiles")],
            "Software-pipeline spatial tiles.";
        pipeline_channel_tiles: bool = true, Kind::Bool, no_effect(AIPU), [axl("pipeline_channel_tiles")],
            "Software-pipeline channel tiles.";
        inter_operator_async: bool = true, Kind::Bool, no_effect(AIPU), [axl("inter_operator_async")],
            "Asynchronous scheduling of operators.";
        use_list_scheduler: bool = false, Kind::Bool, no_effect(AIPU), [axl("use_list_scheduler")],
            "Resource-aware list scheduler.";
        unroll_prologue_epilogue: bool = false, Kind::Bool, no_effect(AIPU), [axl("unroll_prologue_epilogue")],
            "Unroll software-pipeline prologues and epilogues.";
        use_hw_tokens: bool = true, Kind::Bool, no_effect(AIPU), [axl("use_hw_tokens")],
            "Hardware synchronisation tokens.";
        group_ifdw_tasks: bool = false, Kind::Bool, no_effect(AIPU), [axl("group_ifdw_tasks")],
            "Hoist and group IFDW operations.";
        double_buffer: bool = true, Kind::Bool, no_effect(DEVICE_IO), [axl("double_buffer")],
            "Double-buffer host-device transfers.";
        max_memplan_attempts: u32 = 5, POSITIVE, no_effect("kiln's memory planner is exact and runs once"), [axl("max_memplan_attempts")],
            "Attempts of the memory planner.";
        max_tiling_attempts: u32 = 8, POSITIVE, no_effect(TILING), [axl("max_tiling_attempts")],
            "Attempts to tile an operator to fit memory.";
        force_h_tiling: Option<u32> = None, Kind::Nullable(&POSITIVE), no_effect(TILING), [axl("force_h_tiling")],
            "Force a height tiling factor.";
        force_oc_tiling: Option<u32> = None, Kind::Nullable(&POSITIVE), no_effect(TILING), [axl("force_oc_tiling")],
            "Force an output-channel tiling factor.";
        tiling_depth: u32 = 1, POSITIVE, nyi_warn(DEPTH_FIRST), [axl("tiling_depth")],
            "Tiling depth to search (above 1: depth-first scheduling).";
        dfs_search_constraint: Option<i64> = None, Kind::Nullable(&INT), nyi_warn(DEPTH_FIRST), [axl("dfs_search_constraint")],
            "Limit of the depth-first search space.";
        enable_buffer_promotion: bool = true, Kind::Bool, no_effect(AIPU), [axl("enable_buffer_promotion")],
            "Promote buffers from DDR to L2/L1.";
        split_buffer_promotion: bool = false, Kind::Bool, no_effect(AIPU), [axl("split_buffer_promotion")],
            "Promote to L1 and L2 in separate passes.";
        io_memory_pool: MemoryPool = MemoryPool::Ddr, Kind::Choice(MemoryPool::CHOICES), no_effect(AIPU), [axl("io_memory_pool")],
            "Initial memory of I/O buffers.";
        constant_memory_pool: MemoryPool = MemoryPool::Ddr, Kind::Choice(MemoryPool::CHOICES), no_effect(AIPU), [axl("constant_memory_pool")],
            "Initial memory of constant buffers.";
        workspace_memory_pool: MemoryPool = MemoryPool::Ddr, Kind::Choice(MemoryPool::CHOICES), no_effect(AIPU), [axl("workspace_memory_pool")],
            "Initial memory of workspace buffers.";
        l1_constraint: Option<u64> = None, Kind::Nullable(&UINT), no_effect(AIPU), [axl("l1_constraint")],
            "Most L1 memory the compiler may use.";
        l2_constraint: Option<u64> = None, Kind::Nullable(&UINT), no_effect(AIPU), [axl("l2_constraint")],
            "Most L2 memory the compiler may use.";
        ddr_constraint: Option<u64> = None, Kind::Nullable(&UINT), no_effect(DDR), [axl("ddr_constraint")],
            "Most DDR memory the compiler may use.";
        use_sysdma: bool = false, Kind::Bool, no_effect(AIPU), [axl("use_sysdma")],
            "System DMA for weight transfers.";
        ignore_weight_buffers: bool = true, Kind::Bool, no_effect(AIPU), [axl("ignore_weight_buffers")],
            "Ignore weight buffers when tiling.";
        dma_dual_channel: bool = true, Kind::Bool, no_effect(AIPU), [axl("dma_dual_channel")],
            "Dual-channel DMA.";
        dpu_constants_home: ConstantsHome = ConstantsHome::L2, Kind::Choice(ConstantsHome::CHOICES), no_effect(AIPU), [axl("dpu_constants_home")],
            "Where DPU constants are placed.";
        dpu_instructions_home: InstructionsHome = InstructionsHome::Default, Kind::Choice(InstructionsHome::CHOICES), no_effect(AIPU), [axl("dpu_instructions_home")],
            "Where DPU instructions are placed.";
        dwpu_instructions_home: InstructionsHome = InstructionsHome::Default, Kind::Choice(InstructionsHome::CHOICES), no_effect(AIPU), [axl("dwpu_instructions_home")],
            "Where DWPU instructions are placed.";
        page_memory: bool = true, Kind::Bool, no_effect(AIPU), [axl("page_memory")],
            "Page L2 and DDR memory.";
        elf_in_ddr: bool = true, Kind::Bool, no_effect(AIPU), [axl("elf_in_ddr")],
            "Keep the ELF file in DDR.";
        stream_tasklist: bool = true, Kind::Bool, no_effect(AIPU), [axl("stream_tasklist")],
            "Stream the task list to the AIPU.";
        mvm_utilization_limit: f64 = 1.0, float(0.125, 1.0), no_effect(AIPU), [axl("mvm_utilization_limit")],
            "Utilisation limit of the MVM array, 0.125-1.0.";
        enable_icr: bool = true, Kind::Bool, no_effect(AIPU), [axl("enable_icr")],
            "In-core replication.";
        icrx_force: i64 = -1, int(-1, i64::MAX), no_effect(AIPU), [axl("icrx_force")],
            "Forced in-core replication factor (-1: automatic).";
        icrx_parallel_block_threshold: u32 = 4, int(1, 4), no_effect(AIPU), [axl("icrx_parallel_block_threshold")],
            "Most parallel IMC blocks with in-core replication, 1-4.";
        icrx_max_factor: u32 = 8, int(2, 8), no_effect(AIPU), [axl("icrx_max_factor")],
            "Largest in-core replication factor along X, 2-8.";
        enable_swicr: bool = true, Kind::Bool, no_effect(AIPU), [axl("enable_swicr")],
            "Subword in-core replication.";
        imc_double_buffer_pipeline: bool = false, Kind::Bool, no_effect(AIPU), [axl("imc_double_buffer_pipeline")],
            "Double-buffer IMC weights in pipelines.";
        imc_double_buffer_sequential: bool = false, Kind::Bool, no_effect(AIPU), [axl("imc_double_buffer_sequential")],
            "Double-buffer IMC weights in sequential sections.";
        dpu_allocation_algorithm: DpuAllocation = DpuAllocation::TryAll, Kind::Choice(DpuAllocation::CHOICES), no_effect(AIPU), [axl("dpu_allocation_algorithm")],
            "DPU register-allocation algorithm.";
        softmax_neutral_value: f64 = -100000.0, ANY_FLOAT, no_effect("kiln computes softmax exactly; there is no padded look-up table"), [axl("softmax_neutral_value")],
            "Padding value that leaves softmax unchanged.";
        frequency: u64 = 800_000_000, int(20_000_000, 800_000_000), no_effect(DEVICE), [axl("frequency")],
            "Device clock in Hz.";
        aipu_cores_used: u32 = 1, int(1, 4), no_effect("AIPU cores; CPU threads are set by num_of_cores"), [axl("aipu_cores_used")],
            "AIPU cores to compile for, 1-4.";
        resources_used: f64 = 1.0, float_open_min(0.0, 1.0), no_effect(AIPU), [axl("resources_used")],
            "Fraction of device memory the model may use.";
        multicore_mode: MulticoreMode = MulticoreMode::Multiprocess, Kind::Choice(MulticoreMode::CHOICES), no_effect("AIPU multicore execution modes; CPU threads are set by num_of_cores"), [axl("multicore_mode")],
            "Multicore execution mode.";
        l1_size_reserved: u64 = 524_288, UINT, no_effect(AIPU), [axl("l1_size_reserved")],
            "L1 reserved for the system (bytes).";
        l1_size_used: u64 = 4_194_304, UINT, no_effect(AIPU), [axl("l1_size_used")],
            "L1 available to the compiler (bytes).";
        l1_virtual_address: u64 = 206_175_207_424, UINT, no_effect(AIPU), [axl("l1_virtual_address")],
            "Virtual address of L1.";
        l1_core0_physical_address: u64 = 402_653_184, UINT, no_effect(AIPU), [axl("l1_core0_physical_address")],
            "Physical address of core 0's L1.";
        l2_size_reserved: u64 = 1_245_184, UINT, no_effect(AIPU), [axl("l2_size_reserved")],
            "L2 reserved for the system (bytes).";
        l2_size_reserved_tasklist: u64 = 1_048_576, UINT, no_effect(AIPU), [axl("l2_size_reserved_tasklist")],
            "L2 reserved per core for the task list (bytes).";
        l2_size_used: u64 = 33_554_432, UINT, no_effect(AIPU), [axl("l2_size_used")],
            "L2 size (bytes).";
        ddr_size_max: u64 = 1_073_741_824, UINT, no_effect(DDR), [axl("ddr_size_max")],
            "DDR size (bytes).";
        ddr_size_reserved: u64 = 33_554_432, UINT, no_effect(DDR), [axl("ddr_size_reserved")],
            "DDR reserved for the system (bytes).";
        ddr_size_used: u64 = 1_073_741_824, UINT, no_effect(DDR), [axl("ddr_size_used")],
            "DDR available (bytes).";
        trace_tvm_passes: bool = false, Kind::Bool, no_effect(TVM), [axl("trace_tvm_passes")],
            "Trace TVM passes.";
        propagate_span_information: bool = true, Kind::Bool, no_effect(TVM), [axl("propagate_span_information")],
            "Propagate span information through the compiler.";
        randomize_onnx_model: bool = true, Kind::Bool, IMPLEMENTED, [axl("randomize_onnx_model")],
            "With save_error_artifact: the saved ONNX model's float weights are replaced by uniform random values over each tensor's range (same shape and type; integer tensors kept).";
        save_error_artifact: bool = false, Kind::Bool, IMPLEMENTED, [axl("save_error_artifact")],
            "When a compile or run fails, write a repro bundle to output_dir (else the temporary directory; the error names it): the model, the resolved configuration, the run's inputs (.npz), the failing node alone with its captured inputs (.onnx + .npz, ONNX models), kiln's version and the error; `kiln repro BUNDLE` replays it.";
    }
}

section! {
    /// Options of a session running a program.
    pub struct RuntimeConfig in Runtime {
        num_of_cores: u32 = 1, POSITIVE, IMPLEMENTED, [aic("num_of_cores"), qaic("aic_num_cores"), graph("num_cores")],
            "Compute threads of a session (AIC: NSP cores): the caller plus num_of_cores - 1 workers, which spin only during a run.";
        run_time_limit_ms: u64 = 0, UINT, IMPLEMENTED, [],
            "kiln's own: most wall-clock milliseconds one run may take; past it the run ends with an error naming the limit, the node it reached and the time (checked between steps and between the work chunks of long kernels, so it ends within one chunk). 0 (default): no limit. A RunOptions time limit overrides it for one call.";
        run_memory_limit_mb: u64 = 0, UINT, IMPLEMENTED, [],
            "kiln's own: most MiB a run's own tensors may hold at once (the planned arena plus the values outside it, inputs included while the run holds them, each output checked from the op's shape inference before it is computed; constants and mapped weights not counted); past it the run ends with an error naming the limit, the node and the figures. 0 (default): three quarters of the machine's physical memory.";
        loop_iteration_limit: u64 = 10000000, POSITIVE, IMPLEMENTED, [],
            "kiln's own: most iterations of one execution of a Loop node (whatever its trip count and condition say); past it the run ends with an error naming the Loop.";
        shape_cache_size: u32 = 8, UINT, IMPLEMENTED, [],
            "kiln's own: for a model with symbolic input dims, the most input-shape specialisations a session compiles at run time (on the first run of new shapes) and keeps, least recently used dropped first, at most 4 x this many compiles per session (then new shapes run shape-generic); 0 runs new shapes on the shape-generic program.";
        enable_profiling: bool = false, Kind::Bool, IMPLEMENTED, [qaic("enable_profiling")],
            "Profile each run (per-step times); exclusive with enable_metrics.";
        enable_metrics: bool = false, Kind::Bool, IMPLEMENTED, [qaic("enable_metrics")],
            "Collect latency metrics (percentiles) of the runs; exclusive with enable_profiling.";
        num_inferences: u64 = 40, POSITIVE, IMPLEMENTED, [qaic("num_inferences")],
            "Runs of a benchmark (run_benchmark); exclusive with inf_time.";
        inf_time: Option<f64> = None, Kind::Nullable(&float_open_min(0.0, f64::INFINITY)), IMPLEMENTED, [qaic("inf_time")],
            "Seconds a benchmark runs for, instead of num_inferences.";
        num_activations: u32 = 1, POSITIVE, IMPLEMENTED, [aic_rt("num_activations"), qaic("num_activations")],
            "Concurrent activations (instances) of the model: kiln bench runs this many inferences at once on one session.";
        set_size: u32 = 10, POSITIVE, no_effect("ExecObjs are device submission objects; kiln's runs need none"), [qaic("set_size")],
            "Number of ExecObjs to create.";
        dev_id: u32 = 0, UINT, no_effect(DEVICE), [qaic("dev_id")],
            "Device to run on.";
        device_ids: Vec<u32> = Vec::new(), Kind::IntList, no_effect(DEVICE), [aic_rt("device_ids")],
            "Devices to run on.";
        submit_num_retries: u32 = 5, UINT, no_effect("there is no device submission queue that can time out"), [aic_rt("submit_num_retries")],
            "Retries when a submission times out.";
        submit_timeout: u32 = 0, UINT, no_effect("there is no device submission queue that can time out"), [aic_rt("submit_timeout")],
            "Seconds to wait for a submission.";
        threads_per_queue: u32 = 4, POSITIVE, no_effect("inputs are used in place; there is no host pre/post-processing stage with threads of its own"), [aic_rt("threads_per_queue")],
            "Host threads for pre- and post-processing.";
        host_processes_used: u32 = 1, POSITIVE, no_effect("a Session runs in the calling process"), [axl("host_processes_used")],
            "Host processes used during execution.";
        input_dmabuf: bool = false, Kind::Bool, no_effect(DEVICE_IO), [axl("input_dmabuf")],
            "DMA buffers for inputs.";
        output_dmabuf: bool = false, Kind::Bool, no_effect(DEVICE_IO), [axl("output_dmabuf")],
            "DMA buffers for outputs.";
        runtime_dir: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), no_effect("kiln's runtime is built in; it has no install directory"), [axl("runtime_dir")],
            "Directory of the Axelera runtime.";
        device_dir: Option<PathBuf> = None, Kind::Nullable(&Kind::Path), no_effect(DEVICE), [axl("device_dir")],
            "Directory of the device.";
        profiling_levels: Vec<ProfilingLevel> = Vec::new(), Kind::ChoiceList(ProfilingLevel::CHOICES), no_effect("AIPU trace-line levels; see enable_profiling for kiln's profile"), [axl("profiling_levels")],
            "Trace levels to enable.";
        profiling_drop_percentile: f64 = 0.25, float_open_max(0.0, 1.0), no_effect("drops spin-up outliers of AIPU traces; kiln's metrics report percentiles instead"), [axl("profiling_drop_percentile")],
            "Fraction of profiling data dropped at each end, in [0, 1).";
    }
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_values_of_their_kind() {
        for s in crate::registry::options() {
            let d = s.default_value();
            assert_eq!(
                s.kind.normalize(&d).as_ref(),
                Ok(&d),
                "{}: default {d} vs {:?}",
                s.name,
                s.kind
            );
        }
    }

    #[test]
    fn lead_api_fields_have_their_defaults() {
        let c = CompileConfig::default();
        let r = RuntimeConfig::default();
        assert_eq!(c.optimization_type, 2);
        assert!(c.onnx_define_symbol.is_empty() && c.output_tensors.is_empty());
        assert!(!c.enable_intermediate_outputs && !c.gen_crc && c.output_dir.is_none());
        assert_eq!((r.num_of_cores, r.num_activations), (1, 1));
        assert!(!r.enable_profiling);
    }
}
