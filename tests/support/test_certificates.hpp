// A throw-away certificate authority for TLS tests, made with Debian's
// openssl command: a CA, a server certificate for 127.0.0.1 and a client
// certificate it signed, and a second CA that signed nothing here (what a
// client trusting the wrong authority holds). EC keys: made in
// milliseconds. Everything lives in a temporary directory removed with it.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

namespace corma::testing {

class TestCertificates {
 public:
  TestCertificates()
      : dir_(std::filesystem::temp_directory_path() / ("corma-pki-" + std::to_string(::getpid()) + "-" +
                                                       std::to_string(next_instance()))) {
    std::filesystem::create_directories(dir_);
    made_ = make();
  }
  TestCertificates(const TestCertificates&) = delete;
  TestCertificates& operator=(const TestCertificates&) = delete;
  ~TestCertificates() { std::filesystem::remove_all(dir_); }

  /// Why certificates could not be made here, if they could not.
  [[nodiscard]] std::optional<std::string> missing() const {
    if (made_) return std::nullopt;
    return "openssl could not make the test certificates (scripts/setup installs Debian's openssl): " + failed_;
  }

  [[nodiscard]] std::string file(const std::string& name) const { return (dir_ / name).string(); }
  [[nodiscard]] std::string ca() const { return file("ca.pem"); }
  [[nodiscard]] std::string other_ca() const { return file("other-ca.pem"); }
  [[nodiscard]] std::string server_cert() const { return file("server.pem"); }
  [[nodiscard]] std::string server_key() const { return file("server.key"); }
  [[nodiscard]] std::string client_cert() const { return file("client.pem"); }
  [[nodiscard]] std::string client_key() const { return file("client.key"); }

 private:
  static int next_instance() {
    static int instance = 0;
    return ++instance;
  }

  bool run(const std::string& command) {
    const auto full = "cd '" + dir_.string() + "' && " + command + " >openssl.log 2>&1";
    if (std::system(full.c_str()) == 0) return true;
    failed_ = command;
    return false;
  }

  /// A self-signed CA called `name`.
  bool authority(const std::string& name) {
    return run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=" + name +
               " -keyout " + name + ".key -out " + name + ".pem");
  }

  /// A certificate called `name` signed by ca.pem, with these extensions.
  bool signed_by_ca(const std::string& name, const std::string& extensions) {
    std::ofstream(dir_ / (name + ".ext")) << extensions;
    return run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=" + name + " -keyout " +
               name + ".key -out " + name + ".csr") &&
           run("openssl x509 -req -days 2 -in " + name + ".csr -CA ca.pem -CAkey ca.key -CAcreateserial -extfile " +
               name + ".ext -out " + name + ".pem");
  }

  bool make() {
    // etcd's gateway dials etcd itself with the server certificate: it is a
    // client certificate too.
    return authority("ca") && authority("other-ca") &&
           signed_by_ca("server",
                        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n") &&
           signed_by_ca("client", "extendedKeyUsage=clientAuth\n");
  }

  std::filesystem::path dir_;
  bool made_ = false;
  std::string failed_;
};

}  // namespace corma::testing
