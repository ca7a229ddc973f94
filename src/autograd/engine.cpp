// The backward engine, autograd metadata, grad mode and graph teardown.
//
// Backward (run_backward):
//  1. count, for every node reachable from the roots, how many edges point at it (iterative DFS);
//  2. start from the roots; a node runs once all of its incoming gradients have arrived, and the
//     ready node created last runs first (highest sequence number), mirroring the forward;
//  3. gradients arriving at the same node input are summed; saved tensors are released as soon as
//     a node has run (unless retain_graph).
#include <algorithm>
#include <optional>
#include <queue>
#include <unordered_map>

#include "autograd/node.h"
#include "core/op_profile.h"
#include "core/ops.h"

namespace mw {

// ---------------- metadata ----------------

AutogradMeta* autograd_meta(const Tensor& t) {
  return t.defined() ? static_cast<AutogradMeta*>(t.autograd_meta()) : nullptr;
}

AutogradMeta& ensure_autograd_meta(const Tensor& t) {
  MW_CHECK_T(AutogradError, t.defined(), "autograd on an undefined tensor");
  if (!t.autograd_meta()) t.set_autograd_meta(std::make_shared<AutogradMeta>());
  return *autograd_meta(t);
}

const Tensor& set_requires_grad(const Tensor& t, bool requires_grad) {
  auto& meta = ensure_autograd_meta(t);
  MW_CHECK_T(AutogradError, !meta.grad_fn, "set_requires_grad: ", t.desc(),
             " is the result of an op; only leaves can be marked (use detach() first)");
  MW_CHECK_T(AutogradError, !requires_grad || is_floating(t.dtype()),
             "set_requires_grad: only floating tensors can require grad, got ", t.desc());
  meta.requires_grad = requires_grad;
  return t;
}

bool requires_grad(const Tensor& t) {
  auto* m = autograd_meta(t);
  return m && (m->requires_grad || m->grad_fn);
}

bool is_leaf(const Tensor& t) {
  auto* m = autograd_meta(t);
  return !m || !m->grad_fn;
}

std::shared_ptr<Node> grad_fn(const Tensor& t) {
  auto* m = autograd_meta(t);
  return m ? m->grad_fn : nullptr;
}

Tensor grad(const Tensor& t) {
  auto* m = autograd_meta(t);
  return m ? m->grad : Tensor();
}

void set_grad(const Tensor& t, Tensor g) {
  if (g.defined()) check_same_shape("set_grad", t, g);
  ensure_autograd_meta(t).grad = std::move(g);
}

void zero_grad(const Tensor& t) {
  if (auto* m = autograd_meta(t)) m->grad = Tensor();
}

void add_grad_ready_hook(const Tensor& leaf, GradReadyHook hook) {
  MW_CHECK_T(AutogradError, is_leaf(leaf), "grad-ready hooks go on leaves, not on ", leaf.desc());
  ensure_autograd_meta(leaf).grad_ready_hooks.push_back(std::move(hook));
}

void add_grad_rows_ready_hook(const Tensor& leaf, GradRowsReadyHook hook) {
  MW_CHECK_T(AutogradError, is_leaf(leaf) && leaf.dim() == 2,
             "rows-ready hooks go on 2-D leaves (embedding tables), not on ", leaf.desc());
  ensure_autograd_meta(leaf).grad_rows_ready_hooks.push_back(std::move(hook));
}

// ---------------- grad mode ----------------

namespace {
thread_local bool t_grad_enabled = true;
}
bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = previous_; }
EnableGradGuard::EnableGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { t_grad_enabled = previous_; }

// ---------------- nodes ----------------

uint64_t next_sequence_nr() {
  static std::atomic<uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

namespace {
// Iterative teardown: a node being deleted hands its children to a pending list instead of letting
// their destructors recurse.
thread_local bool t_deleting = false;
thread_local std::vector<std::shared_ptr<Node>> t_pending_delete;

void delete_node(Node* node) {
  for (auto& e : node->next_edges)
    if (e.fn) t_pending_delete.push_back(std::move(e.fn));
  node->next_edges.clear();
  if (t_deleting) {
    delete node;
    return;
  }
  t_deleting = true;
  delete node;
  while (!t_pending_delete.empty()) {
    std::shared_ptr<Node> next = std::move(t_pending_delete.back());
    t_pending_delete.pop_back();
    next.reset();  // if last owner: delete_node runs, appends its children, returns at once
  }
  t_deleting = false;
}
}  // namespace

std::shared_ptr<Node> adopt_node(Node* node) {
  node->sequence_nr = next_sequence_nr();
  return std::shared_ptr<Node>(node, delete_node);
}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grad_outputs) {
  MW_CHECK_T(AutogradError, backward_ != nullptr, "backward through ", name_,
             " a second time: its saved tensors were already freed; pass retain_graph=true to the "
             "first backward");
  return backward_(grad_outputs);
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grad_outputs) {
  Tensor g = std::move(grad_outputs[0]);
  if (!g.defined()) return {};
  auto& meta = ensure_autograd_meta(leaf_);
  MW_CHECK_T(ShapeError, g.shape() == leaf_.shape(), "gradient ", g.desc(), " does not match leaf ",
             leaf_.desc());
  if (!meta.grad.defined()) {
    // Take the incoming buffer when nobody else holds it; else copy (never alias a live tensor).
    bool exclusive = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 &&
                     g.is_contiguous() && g.offset() == 0 && !g.autograd_meta();
    meta.grad = exclusive ? std::move(g) : g.detach().clone();
  } else {
    ops::axpy_(meta.grad, g);
  }
  g = Tensor();  // hooks may release the gradient and reuse its buffer (optim/nvme_states.h)
  for (auto& hook : meta.grad_ready_hooks) hook(leaf_);
  return {};
}

Edge gradient_edge(const Tensor& t) {
  auto* m = autograd_meta(t);
  if (!m) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  if (!m->requires_grad) return {};
  auto acc = m->grad_accumulator.lock();
  if (!acc) {
    acc = adopt_node(new AccumulateGrad(t));
    m->grad_accumulator = acc;
  }
  return {acc, 0};
}

bool any_requires_grad(std::initializer_list<Tensor> inputs) {
  for (const auto& t : inputs)
    if (t.defined() && requires_grad(t)) return true;
  return false;
}

Tensor record(const char* name, const Tensor& out, std::initializer_list<Tensor> inputs,
              const std::function<BackwardFn(const std::vector<bool>& needs)>& make_backward) {
  if (!grad_enabled() || !any_requires_grad(inputs)) return out;
  std::vector<bool> needs;
  std::vector<Edge> edges;
  for (const auto& t : inputs) {
    Edge e = t.defined() ? gradient_edge(t) : Edge{};
    needs.push_back(e.valid());
    edges.push_back(std::move(e));
  }
  auto node = adopt_node(new FunctionNode(name, make_backward(needs)));
  node->next_edges = std::move(edges);
  auto& meta = ensure_autograd_meta(out);
  meta.grad_fn = std::move(node);
  meta.output_nr = 0;
  return out;
}

// ---------------- the engine ----------------

namespace {

// The node being applied and the engine's input buffers, for take_pending_gradient().
struct ApplyContext {
  Node* node = nullptr;
  std::unordered_map<Node*, std::vector<Tensor>>* buffers = nullptr;
  bool retain_graph = false;
};
thread_local ApplyContext t_apply;

struct ReadyOrder {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

void accumulate_into(Tensor& slot, Tensor g) {
  if (!g.defined()) return;
  if (!slot.defined()) {
    slot = std::move(g);
    return;
  }
  bool exclusive = slot.impl_ptr().use_count() == 1 && slot.storage().use_count() == 1 &&
                   slot.is_contiguous() && !slot.autograd_meta();
  if (exclusive) {
    ops::axpy_(slot, g);
  } else {
    slot = ops::binary(ops::BinaryOp::Add, slot, g);
  }
}

}  // namespace

bool graph_retained() { return t_apply.retain_graph; }

Tensor take_pending_gradient(size_t edge_index) {
  if (!t_apply.node || edge_index >= t_apply.node->next_edges.size()) return Tensor();
  const Edge& e = t_apply.node->next_edges[edge_index];
  if (!e.fn) return Tensor();
  auto it = t_apply.buffers->find(e.fn.get());
  if (it == t_apply.buffers->end() || it->second.size() <= e.input_nr) return Tensor();
  Tensor& slot = it->second[e.input_nr];
  if (!slot.defined() || slot.impl_ptr().use_count() != 1 || slot.storage().use_count() != 1 ||
      !slot.is_contiguous() || slot.autograd_meta())
    return Tensor();
  return std::move(slot);
}

namespace {

// Note [Rows-ready hooks]: the engine's side. For each leaf with rows-ready hooks, the nodes that
// send it gradients (one entry per edge) and whether each has run.
struct RowsWatch {
  struct Producer {
    Node* node;
    size_t edge;
    bool done = false;
  };
  std::vector<Producer> producers;
  bool fired = false;
  std::vector<std::function<void()>> joins;  // from the hooks, run before the leaf accumulates
};

bool has_rows_hooks(const Node* n) {
  const Tensor* leaf = n->leaf();
  if (!leaf) return false;
  const AutogradMeta* m = autograd_meta(*leaf);
  return m && !m->grad_rows_ready_hooks.empty();
}

// Sorted distinct row ids still to come from the unfinished producers, or nullopt when some
// unfinished producer is not row-sparse (or its ids are not readable on the host).
std::optional<std::vector<int64_t>> pending_rows(const RowsWatch& w) {
  std::vector<int64_t> rows;
  for (const auto& p : w.producers) {
    if (p.done) continue;
    const auto& rs = p.node->row_sparse;
    if (!rs || rs->edge != p.edge || !rs->ids.defined() || !rs->ids.device().is_host_addressable())
      return std::nullopt;
    const std::vector<int64_t> ids = ops::token_ids(rs->ids);  // embedding() checked the dtype
    rows.insert(rows.end(), ids.begin(), ids.end());
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// Called after producer (n, edge) delivered to a watched AccumulateGrad that still waits for
// others: fires the leaf's rows-ready hooks once, if every producer left is row-sparse.
void maybe_fire_rows_ready(RowsWatch& w, Node* n, size_t edge,
                           std::unordered_map<Node*, std::vector<Tensor>>& buffers) {
  for (auto& p : w.producers)
    if (p.node == n && p.edge == edge) p.done = true;
  if (w.fired || w.producers.empty()) return;
  Node* acc = w.producers.front().node->next_edges[w.producers.front().edge].fn.get();
  auto b = buffers.find(acc);
  if (b == buffers.end() || b->second.empty() || !b->second[0].defined()) return;
  const Tensor& leaf = *acc->leaf();
  AutogradMeta* meta = autograd_meta(leaf);
  if (meta->grad.defined()) return;  // accumulating across backwards: the rows are not final
  std::optional<std::vector<int64_t>> rows = pending_rows(w);
  if (!rows) return;
  w.fired = true;
  for (auto& hook : meta->grad_rows_ready_hooks) {
    std::function<void()> join = hook(leaf, b->second[0], *rows);
    if (join) w.joins.push_back(std::move(join));
  }
}

// Runs every outstanding join when backward leaves early (an exception), before the gradient
// buffers the hooks read from are destroyed.
struct JoinAllOnExit {
  std::unordered_map<Node*, RowsWatch>* watches;
  ~JoinAllOnExit() {
    for (auto& [n, w] : *watches)
      for (auto& join : w.joins) join();
  }
};

}  // namespace

void backward(const Tensor& root, const Tensor& grad_output, bool retain_graph) {
  backward(std::vector<Tensor>{root}, std::vector<Tensor>{grad_output}, retain_graph);
}

namespace {

// The state of one backward call (PyTorch's GraphTask): what each node still waits for, the
// gradients gathered for it, and the nodes ready to run.
struct GraphTask {
  std::unordered_map<Node*, int64_t> dependencies;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_alive;
  std::unordered_map<Node*, RowsWatch> watches;  // Note [Rows-ready hooks]
  std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready;
  bool retain_graph = false;
};

// Each root's edge and its gradient (ones for a scalar root given none).
std::vector<std::pair<Edge, Tensor>> root_edges(const std::vector<Tensor>& roots,
                                                const std::vector<Tensor>& grad_outputs) {
  MW_CHECK_T(AutogradError, roots.size() == grad_outputs.size(), "backward: ", roots.size(),
             " roots but ", grad_outputs.size(), " gradients");
  std::vector<std::pair<Edge, Tensor>> starts;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    Edge e = gradient_edge(r);
    MW_CHECK_T(AutogradError, e.valid(), "backward: ", r.desc(),
               " does not require grad and has no grad_fn; nothing to differentiate");
    Tensor g = grad_outputs[i];
    if (!g.defined()) {
      MW_CHECK_T(AutogradError, r.numel() == 1,
                 "backward: a gradient must be given for non-scalar ", r.desc());
      g = Tensor::ones(r.shape(), r.dtype(), r.device());
    }
    check_same_shape("backward", r, g);
    starts.emplace_back(e, g);
  }
  return starts;
}

// 1. Dependency counts, by an iterative DFS from the roots; the rows-ready watches on the way.
void count_dependencies(GraphTask& task, const std::vector<std::pair<Edge, Tensor>>& starts) {
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (auto& [e, g] : starts) {
    task.keep_alive[e.fn.get()] = e.fn;
    if (!seen[e.fn.get()]) {
      seen[e.fn.get()] = true;
      stack.push_back(e.fn.get());
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.fn) continue;
      if (has_rows_hooks(e.fn.get())) task.watches[e.fn.get()].producers.push_back({n, i});
      ++task.dependencies[e.fn.get()];
      if (!seen[e.fn.get()]) {
        seen[e.fn.get()] = true;
        stack.push_back(e.fn.get());
      }
    }
  }
}

// 2. The roots' gradients into their buffers; the roots nothing else feeds are ready.
void seed_roots(GraphTask& task, const std::vector<std::pair<Edge, Tensor>>& starts) {
  for (auto& [e, g] : starts) {
    auto& buf = task.buffers[e.fn.get()];
    buf.resize(e.fn->num_outputs);
    accumulate_into(buf[e.input_nr], g);
  }
  for (auto& [e, g] : starts)
    if (task.dependencies[e.fn.get()] == 0 && task.buffers.count(e.fn.get())) {
      task.ready.push(e.fn.get());
      task.dependencies[e.fn.get()] = -1;  // queued
    }
}

// The rows-ready hooks' reads end before anyone writes the gradient they read: n, or a producer
// of a watched leaf that has not run yet.
void join_readers_before(GraphTask& task, Node* n) {
  for (auto& [acc, w] : task.watches) {
    if (w.joins.empty()) continue;
    bool writes = acc == n;
    for (const auto& p : w.producers) writes = writes || (p.node == n && !p.done);
    if (!writes) continue;
    for (auto& join : w.joins) join();
    w.joins.clear();
  }
}

std::vector<Tensor> apply_node(GraphTask& task, Node* n, std::vector<Tensor> inputs) {
  const profile::Scope scope(profile::enabled() ? n->name() : std::string());  // Note [Op profile]
  t_apply = {n, &task.buffers, task.retain_graph};
  try {
    std::vector<Tensor> outs = n->apply(std::move(inputs));
    t_apply = {};
    return outs;
  } catch (...) {
    t_apply = {};
    throw;
  }
}

// 3. Runs one ready node and hands its outputs to the nodes its edges point to.
void run_node(GraphTask& task, Node* n) {
  std::vector<Tensor> inputs = std::move(task.buffers[n]);
  task.buffers.erase(n);
  inputs.resize(n->num_outputs);
  bool any = false;
  for (auto& t : inputs) any = any || t.defined();
  join_readers_before(task, n);
  std::vector<Tensor> outs;
  if (any) outs = apply_node(task, n, std::move(inputs));
  if (!task.retain_graph) n->release_saved();
  for (size_t i = 0; i < n->next_edges.size(); ++i) {
    const Edge& e = n->next_edges[i];
    if (!e.fn) continue;
    Node* next = e.fn.get();
    task.keep_alive.try_emplace(next, e.fn);
    if (i < outs.size() && outs[i].defined()) {
      auto& buf = task.buffers[next];
      buf.resize(next->num_outputs);
      accumulate_into(buf[e.input_nr], std::move(outs[i]));
    }
    if (--task.dependencies[next] == 0) {
      task.ready.push(next);
    } else if (auto w = task.watches.find(next); w != task.watches.end()) {
      maybe_fire_rows_ready(w->second, n, i, task.buffers);
    }
  }
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_outputs,
              bool retain_graph) {
  const std::vector<std::pair<Edge, Tensor>> starts = root_edges(roots, grad_outputs);
  NoGradGuard no_grad;  // backward formulas are not themselves recorded
  GraphTask task;
  task.retain_graph = retain_graph;
  JoinAllOnExit join_on_exit{&task.watches};
  count_dependencies(task, starts);
  seed_roots(task, starts);
  while (!task.ready.empty()) {
    Node* n = task.ready.top();
    task.ready.pop();
    run_node(task, n);
  }
}

}  // namespace mw
