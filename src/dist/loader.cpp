// make_communicator: the backend for how this process was launched (communicator.h).
//
// Note [Backend module]: the MPI backend is a shared module, libmw_dist_mpi.so, opened with dlopen
// only when a run needs it: launched by mpirun (its environment says so) or asked for with --dist
// mpi. gpt2_train therefore starts without libmpi.so installed, a single process never loads it,
// and the project builds without MPI (the module is then simply not built). The module is looked
// for in $MW_DIST_MPI_MODULE, next to the executable, then where the build put it.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "core/numbers.h"
#include "dist/async_communicator.h"

#ifndef MW_DIST_MPI_MODULE_PATH
#define MW_DIST_MPI_MODULE_PATH ""
#endif

namespace mw::dist {

namespace {

constexpr const char* kModuleName = "libmw_dist_mpi.so";

std::string launcher_variable() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE"})
    if (std::getenv(name)) return name;
  return "";
}

std::vector<std::string> module_candidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("MW_DIST_MPI_MODULE")) paths.push_back(env);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) paths.push_back((exe.parent_path() / kModuleName).string());
  if (std::string(MW_DIST_MPI_MODULE_PATH).size() > 0) paths.push_back(MW_DIST_MPI_MODULE_PATH);
  return paths;
}

const mw_dist_backend_v1* load_mpi_backend(const std::string& why) {
  std::string tried;
  for (const std::string& path : module_candidates()) {
    if (!std::filesystem::exists(path)) {
      tried += str("\n  ", path, ": not found");
      continue;
    }
    // RTLD_GLOBAL: Open MPI's own plugins resolve symbols of libmpi.so through the global scope.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
      tried += str("\n  ", path, ": ", dlerror());
      continue;
    }
    auto entry = reinterpret_cast<mw_dist_backend_entry>(dlsym(handle, MW_DIST_BACKEND_ENTRY));
    if (!entry) {
      tried += str("\n  ", path, ": no symbol ", MW_DIST_BACKEND_ENTRY);
      continue;
    }
    return entry();  // the module stays loaded for the life of the process
  }
  throw CommError(str(why, " needs the MPI backend module ", kModuleName,
                      ", which could not be loaded:", tried,
                      "\nInstall Open MPI (apt-get install openmpi-bin libopenmpi-dev), re-run "
                      "cmake and rebuild (the module is built when MPI is found), or point "
                      "MW_DIST_MPI_MODULE at the module"));
}

}  // namespace

bool launched_by_mpi() { return !launcher_variable().empty(); }

std::shared_ptr<Communicator> make_communicator(const CommOptions& options) {
  const std::string& b = options.backend;
  MW_CHECK_T(InvalidArgument, b == "auto" || b == "local" || b == "mpi", "--dist '", b,
             "': expected auto, local or mpi");
  const std::string var = launcher_variable();
  if (b == "local" || (b == "auto" && var.empty())) return make_local_communicator();
  const std::string why = b == "mpi" ? std::string("--dist mpi")
                                     : str("this process was started by an MPI launcher (", var,
                                           "=", std::getenv(var.c_str()), ") and");
  return std::make_shared<AsyncCommunicator>(load_mpi_backend(why), options.timeout_ms);
}

}  // namespace mw::dist
