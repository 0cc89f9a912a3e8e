// SPDX-License-Identifier: Apache-2.0
// Status messages (thread-local) and logging.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "core.hpp"

namespace fly {

namespace {
thread_local std::string t_message;

std::string vformat(const char* fmt, va_list ap) {
  char buf[1024];
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  std::string s;
  if (n >= 0 && size_t(n) < sizeof buf) {
    s.assign(buf, size_t(n));
  } else if (n > 0) {
    s.resize(size_t(n) + 1);
    std::vsnprintf(&s[0], s.size(), fmt, ap2);
    s.resize(size_t(n));
  }
  va_end(ap2);
  return s;
}
}  // namespace

// Messages are for people: longer ones (a format given a long string) are cut here.
constexpr size_t kMaxMessage = 2048;

fly_status fail(fly_status s, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  t_message = vformat(fmt, ap);
  va_end(ap);
  if (t_message.size() > kMaxMessage) {
    t_message.resize(kMaxMessage);
    t_message += "...";
  }
  log(LogLevel::kDebug, "error %s: %s", fly_status_string(s), t_message.c_str());
  return s;
}

void clear_error() { t_message.clear(); }

std::string printable(const char* s, size_t max) {
  if (!s) return "(null)";
  std::string out;
  size_t n = 0;
  for (; s[n] && n < max; ++n) {
    const unsigned char c = static_cast<unsigned char>(s[n]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += char(c);
    } else {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    }
  }
  if (s[n]) out += "...(" + std::to_string(n + std::strlen(s + n)) + " bytes)";
  return out;
}

LogLevel log_level() {
  static const LogLevel level = [] {
    const char* e = std::getenv("FLYKERNELS_LOG");
    if (!e) return LogLevel::kOff;
    if (!std::strcmp(e, "info") || !std::strcmp(e, "1")) return LogLevel::kInfo;
    if (!std::strcmp(e, "debug") || !std::strcmp(e, "2")) return LogLevel::kDebug;
    return LogLevel::kOff;
  }();
  return level;
}

void log(LogLevel lvl, const char* fmt, ...) {
  if (int(log_level()) < int(lvl)) return;
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[flykernels] %s\n", s.c_str());
}

}  // namespace fly

extern "C" {

FLY_API const char* fly_get_last_error(void) { return fly::t_message.c_str(); }

FLY_API const char* fly_status_string(fly_status s) {
  switch (s) {
    case FLY_SUCCESS: return "FLY_SUCCESS";
    case FLY_ERROR_INVALID_ARGUMENT: return "FLY_ERROR_INVALID_ARGUMENT";
    case FLY_ERROR_UNSUPPORTED: return "FLY_ERROR_UNSUPPORTED";
    case FLY_ERROR_NO_DEVICE: return "FLY_ERROR_NO_DEVICE";
    case FLY_ERROR_ARCH_NOT_BUILT: return "FLY_ERROR_ARCH_NOT_BUILT";
    case FLY_ERROR_KERNEL_IMAGE: return "FLY_ERROR_KERNEL_IMAGE";
    case FLY_ERROR_DATABASE: return "FLY_ERROR_DATABASE";
    case FLY_ERROR_CUDA: return "FLY_ERROR_CUDA";
    case FLY_ERROR_MISALIGNED: return "FLY_ERROR_MISALIGNED";
    case FLY_ERROR_WORKSPACE: return "FLY_ERROR_WORKSPACE";
    case FLY_ERROR_INTERNAL: return "FLY_ERROR_INTERNAL";
  }
  return "FLY_ERROR_UNKNOWN_STATUS";
}

}  // extern "C"
