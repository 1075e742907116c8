// A loopback TCP proxy for client tests: forwards bytes both ways to a target until Freeze(),
// then forwards nothing while keeping every connection open, as a peer that vanished without
// closing its connections (a host that lost power, a partition) looks to the client.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace orthoserve::client::testing {

class FreezingProxy {
 public:
  // Listens on 127.0.0.1:<ephemeral>; `target_port` is the port on 127.0.0.1 to forward to.
  explicit FreezingProxy(int target_port) : target_port_(target_port) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    if (bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(listener_, 16) != 0 ||
        getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return;  // address() stays empty; the test fails on it.
    }
    address_ = absl::StrCat("127.0.0.1:", ntohs(a.sin_port));
    accept_thread_ = std::thread([this] { Accept(); });
  }

  ~FreezingProxy() {
    closed_ = true;
    shutdown(listener_, SHUT_RDWR);  // Ends the accept thread's accept().
    if (accept_thread_.joinable()) accept_thread_.join();
    close(listener_);
    // Only the accept thread touched fds_ and pumps_; it has ended.
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);  // Ends the pumps' recv().
    for (std::thread& t : pumps_) t.join();
    for (int fd : fds_) close(fd);
  }

  const std::string& address() const { return address_; }
  // From now on nothing is forwarded, and no connection is closed.
  void Freeze() { frozen_ = true; }

 private:
  void Accept() {
    while (!closed_) {
      const int client = accept(listener_, nullptr, nullptr);
      if (client < 0) return;
      const int upstream = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in t{};
      t.sin_family = AF_INET;
      t.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      t.sin_port = htons(static_cast<uint16_t>(target_port_));
      if (connect(upstream, reinterpret_cast<sockaddr*>(&t), sizeof(t)) != 0) {
        close(client);
        close(upstream);
        continue;
      }
      fds_.push_back(client);
      fds_.push_back(upstream);
      pumps_.emplace_back([this, client, upstream] { Pump(client, upstream); });
      pumps_.emplace_back([this, client, upstream] { Pump(upstream, client); });
    }
  }

  void Pump(int from, int to) {
    char buffer[65536];
    while (!closed_) {
      const ssize_t n = recv(from, buffer, sizeof(buffer), 0);
      if (n <= 0) return;
      if (frozen_) continue;  // Swallowed: the peer neither answers nor closes.
      for (ssize_t sent = 0; sent < n;) {
        const ssize_t k = send(to, buffer + sent, n - sent, MSG_NOSIGNAL);
        if (k <= 0) return;
        sent += k;
      }
    }
  }

  const int target_port_;
  int listener_ = -1;
  std::string address_;
  std::atomic<bool> frozen_{false};
  std::atomic<bool> closed_{false};
  std::thread accept_thread_;
  // Written by the accept thread only; read by the destructor after that thread ended.
  std::vector<int> fds_;
  std::vector<std::thread> pumps_;
};

}  // namespace orthoserve::client::testing
