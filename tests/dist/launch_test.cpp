// Note [Launchers] (dist/launch.h): what each launcher's environment says, read from a table.
#include "dist/launch.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace mw::dist {
namespace {

Launch launch_of(const std::map<std::string, std::string>& env) {
  return read_launch([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(Launchers, NoneSaysNothing) {
  const Launch l = launch_of({{"HOME", "/root"}});
  EXPECT_EQ(l.variable, nullptr);
  EXPECT_EQ(l.world_size, 0);
  EXPECT_EQ(l.local_rank, -1);
  EXPECT_EQ(l.local_size, 0);
  EXPECT_EQ(l.slurm_step_tasks, 0);
}

TEST(Launchers, OpenMpiMpichAndMvapichEachSayItInTheirOwnVariables) {
  Launch l = launch_of({{"OMPI_COMM_WORLD_SIZE", "4"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_STREQ(l.variable, "OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(l.world_size, 4);
  EXPECT_EQ(l.local_rank, 3);
  EXPECT_EQ(l.local_size, 4);
  l = launch_of({{"PMI_SIZE", "8"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}});
  EXPECT_STREQ(l.variable, "PMI_SIZE");
  EXPECT_EQ(l.world_size, 8);
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.local_size, 2);
  l = launch_of({{"MV2_COMM_WORLD_SIZE", "2"},
                 {"MV2_COMM_WORLD_LOCAL_RANK", "0"},
                 {"MV2_COMM_WORLD_LOCAL_SIZE", "1"}});
  EXPECT_STREQ(l.variable, "MV2_COMM_WORLD_SIZE");
  EXPECT_EQ(l.world_size, 2);
  EXPECT_EQ(l.local_rank, 0);
  EXPECT_EQ(l.local_size, 1);
}

// srun --mpi=pmix: PMIX_RANK says it is MPI; the size and the local rank are Slurm's. Before
// session 38 this read as "launched, size unknown, no local rank": plain --device cuda was GPU 0
// in every rank and --dist auto took MPI for CUDA tensors.
TEST(Launchers, SrunWithPmixTakesTheStepsSizeAndLocalRank) {
  const Launch l = launch_of({{"PMIX_RANK", "5"},
                              {"SLURM_STEP_ID", "0"},
                              {"SLURM_PROCID", "5"},
                              {"SLURM_STEP_NUM_TASKS", "8"},
                              {"SLURM_LOCALID", "1"},
                              {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"}});
  EXPECT_STREQ(l.variable, "PMIX_RANK");
  EXPECT_EQ(l.world_size, 8);
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.local_size, 4);
  EXPECT_EQ(l.slurm_step_tasks, 8);
  EXPECT_EQ(l.slurm_task, 5);
}

TEST(Launchers, SrunWithPmi2KeepsPmiSizeAndTakesSlurmsLocalRank) {
  const Launch l = launch_of({{"PMI_SIZE", "3"},
                              {"PMI_RANK", "2"},
                              {"SLURM_STEP_ID", "1"},
                              {"SLURM_STEP_NUM_TASKS", "3"},
                              {"SLURM_LOCALID", "0"},
                              {"SLURM_STEP_TASKS_PER_NODE", "2,1"}});
  EXPECT_STREQ(l.variable, "PMI_SIZE");
  EXPECT_EQ(l.world_size, 3);
  EXPECT_EQ(l.local_rank, 0);
  EXPECT_EQ(l.local_size, 0) << "two nodes running 2 and 1: no single local size";
}

// mpirun inside an allocation starts its daemons with srun: the ranks inherit the daemons' step
// (one task per node), which must not override the launcher's own variables.
TEST(Launchers, MpirunInsideAnAllocationIsNotReadAsTheDaemonsStep) {
  const Launch l = launch_of({{"OMPI_COMM_WORLD_SIZE", "8"},
                              {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                              {"SLURM_STEP_ID", "0"},
                              {"SLURM_STEP_NUM_TASKS", "2"},
                              {"SLURM_LOCALID", "0"},
                              {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}});
  EXPECT_EQ(l.world_size, 8);
  EXPECT_EQ(l.local_rank, 3);
  EXPECT_EQ(l.local_size, 4);
}

// srun --mpi=none -n 2: a step of two tasks and no wire-up; make_communicator refuses it
// (Reliability.ASlurmStepWithoutAnMpiWireUpIsRefused runs gpt2_train so).
TEST(Launchers, SrunWithoutAWireUpIsAStepWithoutAVariable) {
  const Launch l = launch_of({{"SLURM_STEP_ID", "0"},
                              {"SLURM_PROCID", "1"},
                              {"SLURM_STEP_NUM_TASKS", "2"},
                              {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(l.variable, nullptr);
  EXPECT_EQ(l.slurm_step_tasks, 2);
  EXPECT_EQ(l.slurm_task, 1);
  EXPECT_EQ(l.local_rank, -1) << "no MPI launch, so no rank to map to a GPU";
  EXPECT_EQ(l.world_size, 0);
}

TEST(Launchers, OnlyWholeNumbersAreRead) {
  EXPECT_EQ(launch_of({{"OMPI_COMM_WORLD_SIZE", "4x"}}).world_size, 0);
  EXPECT_EQ(launch_of({{"OMPI_COMM_WORLD_SIZE", ""}}).world_size, 0);
  EXPECT_EQ(launch_of({{"OMPI_COMM_WORLD_SIZE", "-2"}}).world_size, 0);
  EXPECT_EQ(launch_of({{"OMPI_COMM_WORLD_SIZE", "99999999999"}}).world_size, 0);
  EXPECT_EQ(launch_of({{"OMPI_COMM_WORLD_LOCAL_RANK", "1 "}}).local_rank, -1);
  for (const char* per_node : {"(x2)", "4(2)", "4(x2),1", "x", "4("})
    EXPECT_EQ(
        launch_of(
            {{"PMIX_RANK", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", per_node}})
            .local_size,
        0)
        << per_node;
  EXPECT_EQ(
      launch_of({{"PMIX_RANK", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "12"}})
          .local_size,
      12);
}

}  // namespace
}  // namespace mw::dist
