// make_communicator: the backend for how this process was launched (communicator.h).
//
// Note [Backend module]: the MPI and NCCL backends are shared modules, libmw_dist_mpi.so and
// libmw_dist_nccl.so, opened with dlopen only when a run needs one: MPI when launched by mpirun
// (its environment says so) or asked for with --dist mpi; NCCL only when asked for with --dist
// nccl ("auto" never picks it: it takes CUDA tensors, and the caller must put its tensors on the
// communicator's device, Communicator::cuda_device). gpt2_train therefore starts without
// libmpi.so or libnccl.so installed, a single process loads neither (nor CUDA through them), and
// the project builds without them (a module is then simply not built). Each module is looked for
// in its environment variable ($MW_DIST_MPI_MODULE, $MW_DIST_NCCL_MODULE) when it is set (there
// only), else next to the executable, then where the build put it.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "core/numbers.h"
#include "dist/async_communicator.h"
#include "dist/launch.h"

#ifndef MW_DIST_MPI_MODULE_PATH
#define MW_DIST_MPI_MODULE_PATH ""
#endif
#ifndef MW_DIST_NCCL_MODULE_PATH
#define MW_DIST_NCCL_MODULE_PATH ""
#endif

namespace mw::dist {

namespace {

// One backend module: its file, where to look for it, and what to install when it is missing.
struct ModuleSpec {
  const char* file;      // "libmw_dist_mpi.so"
  const char* env;       // "MW_DIST_MPI_MODULE"
  const char* built_at;  // where this build put it ("" when it was not built)
  const char* what;      // "the MPI backend module"
  const char* install;   // how to get it built
};

const ModuleSpec kMpiModule = {
    "libmw_dist_mpi.so", "MW_DIST_MPI_MODULE", MW_DIST_MPI_MODULE_PATH, "the MPI backend module",
    "Install Open MPI (apt-get install openmpi-bin libopenmpi-dev), re-run cmake and rebuild (the "
    "module is built when MPI is found)"};

const ModuleSpec kNcclModule = {
    "libmw_dist_nccl.so", "MW_DIST_NCCL_MODULE", MW_DIST_NCCL_MODULE_PATH,
    "the NCCL backend module",
    "Install NCCL (apt-get install libnccl2 libnccl-dev, or NVIDIA's NCCL into the CUDA toolkit), "
    "Open MPI (apt-get install openmpi-bin libopenmpi-dev) and the CUDA toolkit, re-run cmake and "
    "rebuild (the module is built when all three are found: cmake prints 'memwall: NCCL backend "
    "ON')"};

std::string launcher_variable() {
  const char* v = launch_from_environment().variable;
  return v ? v : "";
}

// The variable, when set, is the only place looked at: a wrong path is an error, not a silent
// fall-back to another build's module.
std::vector<std::string> module_candidates(const ModuleSpec& spec) {
  const char* env = std::getenv(spec.env);
  if (env && *env) return {env};
  std::vector<std::string> paths;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) paths.push_back((exe.parent_path() / spec.file).string());
  if (std::string(spec.built_at).size() > 0) paths.push_back(spec.built_at);
  return paths;
}

// The module's v2 table when it exports one, else its v1 table read as host memory (backend_abi.h).
bool read_entry(void* handle, mw_dist_backend_v2& out) {
  if (auto v2 =
          reinterpret_cast<mw_dist_backend_v2_entry_fn>(dlsym(handle, MW_DIST_BACKEND_V2_ENTRY))) {
    out = *v2();
    return true;
  }
  auto v1 = reinterpret_cast<mw_dist_backend_entry>(dlsym(handle, MW_DIST_BACKEND_ENTRY));
  if (!v1) return false;
  out = mw_dist_backend_v2{*v1(), MW_DIST_MEMORY_HOST, nullptr, nullptr};
  return true;
}

mw_dist_backend_v2 load_backend(const ModuleSpec& spec, const std::string& why) {
  std::string tried;
  for (const std::string& path : module_candidates(spec)) {
    if (!std::filesystem::exists(path)) {
      const char* env = std::getenv(spec.env);
      tried +=
          str("\n  ", path, ": not found", env && path == env ? str(" ($", spec.env, ")") : "");
      continue;
    }
    // RTLD_GLOBAL: Open MPI's own plugins resolve symbols of libmpi.so through the global scope.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
      tried += str("\n  ", path, ": ", dlerror());
      continue;
    }
    mw_dist_backend_v2 backend{};
    if (!read_entry(handle, backend)) {
      tried += str("\n  ", path, ": no symbol ", MW_DIST_BACKEND_ENTRY);
      continue;
    }
    return backend;  // the module stays loaded for the life of the process
  }
  throw CommError(str(why, " needs ", spec.what, " ", spec.file, ", which could not be loaded:",
                      tried, "\n", spec.install, ", or point ", spec.env, " at the module"));
}

}  // namespace

bool launched_by_mpi() { return !launcher_variable().empty(); }

int launcher_world_size() { return launch_from_environment().world_size; }

int launcher_local_rank() { return launch_from_environment().local_rank; }

std::shared_ptr<Communicator> make_communicator(const CommOptions& options) {
  const std::string& b = options.backend;
  MW_CHECK_T(InvalidArgument, b == "auto" || b == "local" || b == "mpi" || b == "nccl", "--dist '",
             b, "': expected auto, local, mpi or nccl");
  if (b == "nccl") {
    const mw_dist_backend_v2 nccl = load_backend(kNcclModule, "--dist nccl");
    MW_CHECK_T(dist::CommError, nccl.memory == MW_DIST_MEMORY_CUDA && nccl.device,
               "--dist nccl: ", kNcclModule.file,
               " is not an NCCL module (it takes no device memory); point ", kNcclModule.env,
               " at the libmw_dist_nccl.so of this build");
    return std::make_shared<AsyncCommunicator>(nccl, options.timeout_ms);
  }
  if (b == "local") return make_local_communicator();
  const Launch launch = launch_from_environment();  // Note [Launchers] (launch.h)
  const std::string var = launch.variable ? launch.variable : "";
  MW_CHECK_T(InvalidArgument, !var.empty() || launch.slurm_step_tasks < 2, "this process is task ",
             launch.slurm_task, " of ", launch.slurm_step_tasks,
             " in a Slurm step (SLURM_STEP_NUM_TASKS), started without an MPI wire-up (none of "
             "OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK is set): each task would train alone and "
             "write the same outputs. Start the step with srun --mpi=pmix (or pmi2; srun "
             "--mpi=list shows them) or run mpirun inside the allocation; --dist local trains "
             "each task alone on purpose");
  if (b == "auto" && var.empty()) return make_local_communicator();
  const std::string why = b == "mpi" ? std::string("--dist mpi")
                                     : str("this process was started by an MPI launcher (", var,
                                           "=", std::getenv(var.c_str()), ") and");
  auto mpi = std::make_shared<AsyncCommunicator>(load_backend(kMpiModule, why), options.timeout_ms);
  const char* memory = std::getenv("MW_DIST_DEVICE_MEMORY");  // Note [Device memory on the CPU]
  if (memory == nullptr || *memory == '\0') return mpi;
  MW_CHECK_T(InvalidArgument, std::string(memory) == "sim", "MW_DIST_DEVICE_MEMORY='", memory,
             "': expected sim (or unset)");
  return require_memory(mpi, Device::sim());
}

}  // namespace mw::dist
