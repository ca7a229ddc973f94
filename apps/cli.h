// A small command-line parser shared by the apps: "--name value" and "--flag" options, each with a
// default and a help line. Unknown or malformed options throw UsageError; main() prints the usage
// with the reason and exits 2.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/numbers.h"
#include "core/process_limits.h"
#include "models/gpt2/config.h"

namespace mw::cli {

// Prints a report's text to stdout at once (a benchmark's lines appear as they are measured).
inline void print(const std::string& text) { std::cout << text << std::flush; }

// The median of a sample (core/numbers.h), under the name the apps use.
inline double median(std::vector<double> v) { return mw::median(std::move(v)); }

class UsageError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

class Parser {
 public:
  Parser(std::string program, std::string summary)
      : program_(std::move(program)), summary_(std::move(summary)) {}

  // A valued option. An empty value ("--save ''", "--data=") is refused: it is almost always an
  // unset shell variable, and silently meaning "the default" would lose what the user asked for.
  void option(const std::string& name, const std::string& def, const std::string& help) {
    specs_.push_back({name, def, help, false, false, false});
    values_[name] = def;
  }
  // A valued option whose empty value means something (--prompt "": start from <|endoftext|>).
  void text_option(const std::string& name, const std::string& def, const std::string& help) {
    specs_.push_back({name, def, help, false, true, false});
    values_[name] = def;
  }
  // A valued option that may be given several times (--stop A --stop B), without a default;
  // values(name) lists them in order. An empty value is refused, as option()'s is.
  void repeated_option(const std::string& name, const std::string& help) {
    specs_.push_back({name, "", help, false, false, true});
    values_[name] = "";
  }
  void flag(const std::string& name, const std::string& help) {
    specs_.push_back({name, "", help, true, false, false});
    values_[name] = "";
  }

  void parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "-h" || arg == "--help") {
        help_ = true;
        return;
      }
      if (arg.rfind("--", 0) != 0) {
        if (positional_name_.empty()) throw UsageError("unexpected argument '" + arg + "'");
        positionals_.push_back(arg);
        continue;
      }
      std::string name = arg.substr(2), value;
      bool inline_value = false;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        inline_value = true;
      }
      const Spec* spec = find(name);
      if (!spec) throw UsageError("unknown option '--" + name + "'" + nearest(name));
      if (spec->is_flag) {
        if (inline_value) throw UsageError("--" + name + " takes no value");
        values_[name] = std::string(1, '1');  // not = "1": GCC 12 -Wrestrict false positive
        given_[name] = true;  // given() of a switch was always false until session 38
        continue;
      }
      if (!inline_value) {
        if (i + 1 >= argc) throw UsageError("--" + name + " needs a value");
        value = argv[++i];
      }
      if (value.empty() && !spec->allow_empty)
        throw UsageError("--" + name + " '': an empty value; pass a value or leave the option out");
      values_[name] = value;
      given_[name] = true;
      if (spec->repeated) repeated_[name].push_back(value);
    }
  }

  // Accepts arguments that are not options (input files), listed in the usage as `name...`.
  void positionals(const std::string& name, const std::string& help) {
    positional_name_ = name;
    positional_help_ = help;
  }
  const std::vector<std::string>& positional_values() const { return positionals_; }

  bool help_requested() const { return help_; }
  bool given(const std::string& name) const { return given_.count(name) > 0; }
  bool has(const std::string& name) const { return values_.at(name) == "1"; }
  std::string str(const std::string& name) const { return values_.at(name); }
  // Every value of a repeated_option, in the order given; none when it was not given.
  std::vector<std::string> values(const std::string& name) const {
    const auto it = repeated_.find(name);
    return it == repeated_.end() ? std::vector<std::string>{} : it->second;
  }

  // Strict: the whole value must be the number (core/numbers.h); anything else is a UsageError.
  int64_t integer(const std::string& name, int64_t min, int64_t max) const {
    return usage_checked("",
                         [&] { return parse_integer(values_.at(name), "--" + name, min, max); });
  }
  double real(const std::string& name, double min, double max) const {
    return usage_checked("", [&] { return parse_real(values_.at(name), "--" + name, min, max); });
  }
  std::string choice(const std::string& name, const std::vector<std::string>& allowed) const {
    const std::string& v = values_.at(name);
    for (const auto& a : allowed)
      if (a == v) return v;
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : "|") + a;
    throw UsageError("--" + name + " '" + v + "': expected one of " + list);
  }
  // A byte size in [min_bytes, max_bytes] (core/numbers.h's units).
  int64_t bytes(const std::string& name, int64_t min_bytes = 0,
                int64_t max_bytes = kMaxParsedBytes) const {
    const int64_t n =
        usage_checked("--" + name + ": ", [&] { return parse_bytes(values_.at(name)); });
    MW_CHECK_T(cli::UsageError, n >= min_bytes && n <= max_bytes, "--", name, " '",
               values_.at(name), "' is ", n, " bytes; expected between ", min_bytes, " and ",
               max_bytes, " bytes");
    return n;
  }
  std::string usage() const {
    std::string u =
        "usage: " + program_ + " [options]" +
        (positional_name_.empty() ? "" : " " + positional_name_ + "...") + "\n" + summary_ +
        "\n\n" +
        (positional_name_.empty() ? ""
                                  : "  " + positional_name_ + "...: " + positional_help_ + "\n\n") +
        "options:\n";
    for (const auto& s : specs_) {
      std::string left = "  --" + s.name + (s.is_flag ? "" : " V");
      left.resize(std::max<size_t>(left.size() + 2, 30), ' ');
      u += left + s.help + (s.is_flag || s.def.empty() ? "" : " (default " + s.def + ")") + "\n";
    }
    return u;
  }

 private:
  struct Spec {
    std::string name, def, help;
    bool is_flag;
    bool allow_empty;
    bool repeated;  // repeated_option: every value is kept
  };
  template <typename Parse>
  // Runs parse(), turning its InvalidArgument into a UsageError whose message starts with prefix.
  static auto usage_checked(const std::string& prefix, Parse parse) -> decltype(parse()) {
    try {
      return parse();
    } catch (const UsageError&) {
      throw;
    } catch (const InvalidArgument& e) {
      throw UsageError(prefix + e.what());
    }
  }
  const Spec* find(const std::string& name) const {
    for (const auto& s : specs_)
      if (s.name == name) return &s;
    return nullptr;
  }
  // "; did you mean --eval-every?" for the option closest to a mistyped one (at most two edits,
  // or a prefix of it: --step for --steps), "" when none is.
  std::string nearest(const std::string& typed) const {
    auto distance = [](const std::string& a, const std::string& b) {
      std::vector<size_t> row(b.size() + 1);
      for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
      for (size_t i = 1; i <= a.size(); ++i) {
        size_t diagonal = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
          const size_t up = row[j];
          row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
          diagonal = up;
        }
      }
      return row[b.size()];
    };
    const Spec* best = nullptr;
    size_t best_distance = 3;
    for (const auto& s : specs_) {
      const size_t d = s.name.rfind(typed, 0) == 0 ? 1 : distance(typed, s.name);
      if (d < best_distance) best = &s, best_distance = d;
    }
    return best ? "; did you mean --" + best->name + "?" : "";
  }
  std::string program_, summary_;
  std::vector<Spec> specs_;
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> given_;
  std::map<std::string, std::vector<std::string>> repeated_;  // repeated_option values, in order
  std::string positional_name_, positional_help_;
  std::vector<std::string> positionals_;
  bool help_ = false;
};

// Token ids written "50256,464,3290" (each in [0, 2^31)); UsageError naming `option` otherwise.
inline std::vector<int32_t> token_ids(const std::string& option, const std::string& text) {
  std::vector<int32_t> ids;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    try {
      ids.push_back(static_cast<int32_t>(parse_integer(item, "--" + option, 0, INT32_MAX)));
    } catch (const InvalidArgument&) {
      throw UsageError("--" + option + " '" + text + "': expected token ids like 50256,464,3290");
    }
    if (comma == std::string::npos) return ids;
    start = comma + 1;
  }
}

// A prompt option's text holding a backslash and an n, which a shell's single quotes pass as
// typed: the prompt then has no newline there. "" when there is none, else the warning's text.
inline std::string escaped_newline_warning(const std::string& option, const std::string& text) {
  if (text.find("\\n") == std::string::npos) return "";
  return "--" + option +
         " holds a backslash and an n, which is text here, not a newline; in bash write "
         "$'line one\\nline two'";
}

// --device cuda[:N], checked now: a build without CUDA, or no such GPU, is a UsageError naming the
// reason before any work.
// `shown`: the option's whole text, when `text` is a part of it.
inline Device cuda_device(const std::string& text, const std::string& shown = "") {
  try {
    Device d = parse_device(text);
    allocator_for(d);  // throws DeviceError when the GPU is not there
    return d;
  } catch (const Error& e) {
    throw UsageError(str("--device '", shown.empty() ? text : shown, "': ", e.what()));
  }
}

// The run shape of the apps that train GPT-2 (gpt2_bench, nvme_step_bench, gemini_step_bench):
// --model, --batch, --seq, --steps, --threads, declared once here with each app's defaults and
// help lines.
struct RunShapeDefaults {
  std::string steps, steps_help;
  std::string threads = "0",
              threads_help =
                  "worker threads (0 = all cores this process may use: affinity, CPU quota)";
};

inline void declare_run_shape(Parser& p, const RunShapeDefaults& d) {
  p.option("model", "small", "tiny|small|medium|large|xl");
  p.option("batch", "4", "B");
  p.option("seq", "", "T (default 128, or the model's n_positions when smaller)");
  p.option("steps", d.steps, d.steps_help);
  p.option("threads", d.threads, d.threads_help);
}

// The values of declare_run_shape's options, each checked against its range.
struct RunShape {
  std::string model;
  gpt2::Config config;  // the model's preset
  int64_t batch = 0, seq = 0, steps = 0;
  int threads = 0;
};

struct RunShapeLimits {
  int64_t max_batch = 4096;
  int64_t min_seq = 1, max_seq = 0;  // 0: the model's n_positions
  int64_t min_steps = 1, max_steps = 100000;
};

inline RunShape run_shape(const Parser& p, const RunShapeLimits& limits) {
  RunShape s;
  s.model = p.choice("model", {"tiny", "small", "medium", "large", "xl"});
  s.config = gpt2::Config::preset(s.model);
  s.batch = p.integer("batch", 1, limits.max_batch);
  // Not given: 128, or tiny's 32 positions (a default out of range was refused, quoting it).
  s.seq = p.given("seq") ? p.integer("seq", limits.min_seq,
                                     limits.max_seq ? limits.max_seq : s.config.n_positions)
                         : std::min<int64_t>(128, s.config.n_positions);
  s.steps = p.integer("steps", limits.min_steps, limits.max_steps);
  s.threads = static_cast<int>(p.integer("threads", 0, 4096));
  return s;
}

// main() of a tool: parses argv; --help prints the usage (exit 0); a bad flag or argument
// (InvalidArgument, from parsing or from run) prints the usage and the reason (exit 2); a stop
// signal (Interrupted, Note [Stop signals]) prints it and exits 128 + the signal; any other
// failure prints the error (exit 1), even one that is not a std::exception: no input aborts a tool.
// run(parser) returns the exit code.
template <typename Run>
int run_main(Parser& p, const char* program, int argc, char** argv, Run run) {
  raise_open_file_limit();  // Note [Open files]
  try {
    p.parse(argc, argv);
    if (p.help_requested()) {
      std::cout << p.usage();
      return 0;
    }
    return run(p);
  } catch (const Interrupted& e) {
    std::cerr << program << ": " << e.what() << "\n";
    return e.exit_code();
  } catch (const InvalidArgument& e) {
    std::cerr << p.usage() << "\n" << program << ": " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << program << ": error: " << e.what() << "\n";
    return 1;
  } catch (...) {
    std::cerr << program << ": internal error: an unknown exception\n";
    return 1;
  }
}

}  // namespace mw::cli
